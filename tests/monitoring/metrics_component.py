"""A live slea component for the Prometheus scrape test: it sends step payloads through the real
transport (slea.streams.StreamProducer) and then exposes its metrics until it is killed.

  python metrics_component.py client REDIS_URL STREAM PORT   prometheus-client endpoint (serve_metrics)
  python metrics_component.py ray REDIS_URL STREAM PORT      a Ray actor does the sending; the metrics
                                                             leave through Ray's metrics export port PORT
  python metrics_component.py serve - - PORT                 a Serve app named as the library's is called
                                                             through its handle, as the actors call it,
                                                             round after round until killed
Prints "ready" once the metrics are recorded (serve: after the first round).
"""

from __future__ import annotations

import os
import sys
import time

import redis

PAYLOADS = [b"step-1", b"step-2", b"step-3"]


def send(redis_url: str, stream: str) -> None:
    from slea.streams import StreamProducer

    client = redis.Redis.from_url(redis_url)
    StreamProducer(client, stream).send_payloads(PAYLOADS)
    client.close()


class Sender:
    """The Ray actor of `ray` mode."""

    def send(self, redis_url: str, stream: str) -> None:
        from monitoring.metrics import metric

        send(redis_url, stream)
        metric("stream_lag").labels(stream=stream, group="promtest").set(7)  # set once: Ray must keep exporting it


HANDLE_CALLS = {"ok": 4, "unpublished": 3, "broken": 2}  # a round: answered, LibraryNotPublished, RuntimeError


def serve_handle_traffic() -> None:
    """Rounds of HANDLE_CALLS through the Serve handle of an app named as the library's
    (slea.channels.LIBRARY_APP), forever: the counters keep rising, so rate() sees them."""
    from ray import serve

    from slea.channels import LIBRARY_APP, LibraryNotPublished

    @serve.deployment
    class Library:
        def retrieve(self, request: str) -> dict:
            if request == "unpublished":
                raise LibraryNotPublished("no library published yet for run promtest")
            if request == "broken":
                raise RuntimeError("library unavailable")
            return {"experiences": []}

    handle = serve.run(Library.bind(), name=LIBRARY_APP, route_prefix=None)
    rounds = 0
    while True:
        for request, calls in HANDLE_CALLS.items():
            for _ in range(calls):
                try:
                    handle.retrieve.remote(request).result()
                except (LibraryNotPublished, RuntimeError):
                    pass
        rounds += 1
        if rounds == 1:
            print("ready", flush=True)
        time.sleep(0.2)


def main(mode: str, redis_url: str, stream: str, port: int) -> None:
    if mode == "client":
        from monitoring.metrics import serve_metrics

        send(redis_url, stream)
        serve_metrics(port, address="127.0.0.1")
    else:
        import ray

        # the node's metrics agent reads the interval from the environment (not _system_config): with
        # it, a gauge Ray stopped exporting is gone in 2 s, not 20
        os.environ["RAY_metrics_report_interval_ms"] = "500"
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            _metrics_export_port=port,
            _system_config={"metrics_report_interval_ms": 500},
        )
        if mode == "serve":
            serve_handle_traffic()  # prints "ready" itself and never returns
        else:
            # inside the actor, metric() switches to the Ray backend by itself; the actor stays alive
            # so its series stay current
            sender = ray.remote(Sender).remote()
            ray.get(sender.send.remote(redis_url, stream))
    print("ready", flush=True)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
