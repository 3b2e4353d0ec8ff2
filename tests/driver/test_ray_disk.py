"""Ray's disk rule, read before Ray starts (driver/ray_disk.py)."""

import pytest

from driver.ray_disk import GIB, THRESHOLD_VARIABLE, DiskRoom, DiskTooFull, disk_room, require_disk_room


def test_room_is_free_space_above_rays_line():
    # 100 GiB disk, 95% threshold: Ray refuses objects once 5 GiB or less is free; 12 GiB free -> 7 GiB of room.
    room = DiskRoom("/data", free_bytes=12 * GIB, total_bytes=100 * GIB, threshold=0.95)
    assert room.room_bytes == 7 * GIB
    # The CI run that failed: 1 GiB free of 252 GiB is 11.6 GiB past the line.
    assert DiskRoom("/tmp", GIB, 252 * GIB, 0.95).room_bytes == pytest.approx(-11.6 * GIB, rel=1e-3)


def test_describe_names_the_path_the_space_and_the_rule():
    text = DiskRoom("/data", 12 * GIB, 100 * GIB, 0.95).describe()
    assert text == (
        "/data: 12.0 GiB free of 100 GiB; Ray refuses new objects once less than 5% of the disk is free "
        "(RAY_local_fs_capacity_threshold=0.95), 7.0 GiB from here"
    )


def test_threshold_follows_rays_own_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(THRESHOLD_VARIABLE, "0.5")
    assert disk_room(str(tmp_path)).threshold == 0.5
    monkeypatch.delenv(THRESHOLD_VARIABLE)
    assert disk_room(str(tmp_path)).threshold == 0.95


def test_too_full_a_disk_is_refused_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv(THRESHOLD_VARIABLE, "0.000001")  # Ray's line at 99.9999% free: any real disk is past it
    with pytest.raises(DiskTooFull, match=rf"not enough disk for Ray: {tmp_path}: .* GiB free of"):
        require_disk_room(path=str(tmp_path))


def test_spare_space_is_asked_on_top_of_rays_line(tmp_path):
    room = require_disk_room(path=str(tmp_path))
    with pytest.raises(DiskTooFull, match="and this needs"):
        require_disk_room(spare_bytes=room.room_bytes + GIB, path=str(tmp_path))
