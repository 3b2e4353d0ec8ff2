#!/bin/sh
# Init container of the Redis pod: builds the ACL file Redis loads (`aclfile`) and the exporter's
# password file from the mounted Secret slea-redis, so no password is ever on a command line, in
# an environment variable or in a manifest; the ACL file holds SHA-256 hashes only.
#   sh make-acl.sh SECRET_DIR OUT_DIR TEMPLATE
# Users (users.acl.template; an ACL file holds no comments, so they are here): `default` off, so
# no connection is ever it, but with every permission, because Redis replays an AOF's EXEC as the
# default user and checks its permissions again (redis/redis#14541, valkey-io/valkey#3983): without
# them every MULTI/EXEC in the AOF is dropped on restart (tests/deploy/test_redis_acl.py);
# `slea`, the system, limited to the run's keys
# (slea:cluster*: the run ids the RayJob takes from its pods' slea.io/run label, `cluster` as shipped)
# and the commands it sends; `exporter`
# (prometheus-redis-exporter) limited to INFO and friends, no keys.
set -eu
secret_dir=$1
out_dir=$2
template=$3
for key in password exporter-password; do
  if [ ! -s "$secret_dir/$key" ]; then
    echo "make-acl: $secret_dir/$key is missing or empty: create the Secret slea-redis with the keys" \
         "password and exporter-password (deploy/README.md)" >&2
    exit 1
  fi
done
hash() { tr -d '\r\n' < "$1" | sha256sum | cut -d' ' -f1; }
umask 077
sed -e "s/@SLEA_HASH@/$(hash "$secret_dir/password")/" \
    -e "s/@EXPORTER_HASH@/$(hash "$secret_dir/exporter-password")/" "$template" > "$out_dir/users.acl"
# prometheus-redis-exporter's -redis.password-file: a JSON map of Redis address to password
{ printf '{"redis://localhost:6379": "'; tr -d '\r\n' < "$secret_dir/exporter-password"; printf '"}\n'; } \
  > "$out_dir/exporter-passwords.json"
