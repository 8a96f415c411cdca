"""The usable CPUs: the affinity mask capped by a cgroup v1 or v2 CPU quota, read from files laid out
as the kernel lays them out, in a temporary folder."""
import os

import pytest

from encoder_server.model.cpus import MAX_DEFAULT_WORKERS, cgroup_cpu_quota, default_workers, usable_cpus

V2_SELF = "0::/kubepods/pod1/container\n"
V1_SELF = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("cpu_max, expected", [("200000 100000\n", 2.0), ("150000 100000", 1.5),
                                               ("max 100000\n", None), ("garbage", None), ("0 100000", None)])
def test_cgroup_v2_cpu_max(tmp_path, cpu_max, expected):
    write(tmp_path / "kubepods/pod1/container/cpu.max", cpu_max)
    assert cgroup_cpu_quota(tmp_path, V2_SELF) == expected


def test_cgroup_v2_the_tightest_ancestor_applies(tmp_path):
    write(tmp_path / "kubepods/pod1/container/cpu.max", "max 100000")
    write(tmp_path / "kubepods/pod1/cpu.max", "300000 100000")
    write(tmp_path / "kubepods/cpu.max", "800000 100000")
    assert cgroup_cpu_quota(tmp_path, V2_SELF) == 3.0


def test_cgroup_v2_inside_a_container_reads_its_own_root(tmp_path):
    """A container sees the host's path in /proc/self/cgroup but its own cgroup at the mount's root."""
    write(tmp_path / "cpu.max", "100000 100000")
    assert cgroup_cpu_quota(tmp_path, V2_SELF) == 1.0


@pytest.mark.parametrize("quota, expected", [("400000\n", 4.0), ("-1\n", None), ("50000", 0.5)])
def test_cgroup_v1_cfs_quota_over_period(tmp_path, quota, expected):
    folder = tmp_path / "cpu,cpuacct/docker/abc"
    write(folder / "cpu.cfs_quota_us", quota)
    write(folder / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path, V1_SELF) == expected


def test_cgroup_v1_without_a_period_file_or_any_cgroup_has_no_quota(tmp_path):
    write(tmp_path / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "400000")
    assert cgroup_cpu_quota(tmp_path, V1_SELF) is None
    assert cgroup_cpu_quota(tmp_path, "") is None


def test_usable_cpus_takes_the_quota_rounded_down_and_never_below_one(tmp_path):
    cores = len(os.sched_getaffinity(0))
    proc = tmp_path / "self-cgroup"
    proc.write_text(V2_SELF)
    root = tmp_path / "cgroup"
    assert usable_cpus(root, proc) == cores  # no quota: the affinity mask
    write(root / "cpu.max", "50000 100000")
    assert usable_cpus(root, proc) == 1
    write(root / "cpu.max", f"{(cores + 0.5) * 100000:.0f} 100000")
    assert usable_cpus(root, proc) == cores  # a quota above the mask changes nothing
    if cores >= 2:
        write(root / "cpu.max", "150000 100000")
        assert usable_cpus(root, proc) == 1


def test_default_workers_stop_growing_past_the_cap():
    assert [default_workers(n) for n in (1, 2, 8)] == [1, 2, 8]
    assert default_workers(64) == MAX_DEFAULT_WORKERS


def test_cuda_workers_take_two_cpus_each_up_to_the_cap():
    from encoder_server.model.cpus import default_cuda_workers
    assert [default_cuda_workers(n) for n in (1, 2, 3, 4, 16, 64)] == [1, 1, 1, 2, 8, MAX_DEFAULT_WORKERS]


def test_vnni_is_read_from_the_cpu_flags(tmp_path):
    from encoder_server.model.cpus import has_vnni
    from encoder_server.model.onnx_export import int8_recipe
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni\n")
    assert has_vnni(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    assert not has_vnni(info) and not has_vnni(tmp_path / "missing")
    # without VNNI the uint8 x int8 kernel saturates: weights go unsigned
    assert int8_recipe(vnni=True)["weight_type"] == "QInt8" and int8_recipe(vnni=False)["weight_type"] == "QUInt8"
