"""How many CPUs this server may use, and so how many workers it starts by default.

The usable CPUs are the process's affinity mask, capped by the CPU quota of its cgroup (cgroup v2
`cpu.max`, v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us`), which `docker run --cpus` and a
Kubernetes CPU limit set: a container limited to 2 CPUs on a 64-core host sees 64 in its mask.
A quota of 2.5 CPUs counts as 2. The tightest quota on the way from the process's cgroup up to the
root applies.

Lanes (onnx on cpu) or worker processes (torch) default to one per usable CPU up to
MAX_DEFAULT_WORKERS; past that the CPUs are shared out as intra-op threads, so memory stays bounded
on a large host (each lane holds its activations, each process its own copy of the packed weights).
On cuda there is a worker process per two CPUs, as many as the GPU's memory holds (gpu_memory.py).
"""
import math
import os
from pathlib import Path

CGROUP_ROOT = "/sys/fs/cgroup"
MAX_DEFAULT_WORKERS = 8
# threads of the lone lane (worker 0's session for a single text on an idle server); a pass of one
# short text has little to share out, so past this many (a guess: measured on 2 cores only) the
# extra threads would mostly spin
MAX_LONE_THREADS = 8


def usable_cpus(cgroup_root=CGROUP_ROOT, proc_cgroup="/proc/self/cgroup"):
    cpus = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota(Path(cgroup_root), _read(proc_cgroup) or "")
    return max(1, min(cpus, math.floor(quota))) if quota is not None else cpus


def default_workers(cpus):
    return min(cpus, MAX_DEFAULT_WORKERS)


def default_cuda_workers(cpus):
    """CUDA worker processes: one per two CPUs, up to MAX_DEFAULT_WORKERS. A CUDA worker's own
    Python (tokenizing, planning passes, copying rows) keeps a core busy while the GPU waits for it,
    and the ventilator and the sink need cores too. Measured on an H200 with 16 cores (issue 31),
    one worker served 28 to 42% of the best configuration's texts/s, 4 and 8 workers 77 to 100%."""
    return max(1, min(cpus // 2, MAX_DEFAULT_WORKERS))


def lone_lane_threads():
    return min(usable_cpus(), MAX_LONE_THREADS)


def has_vnni(cpuinfo="/proc/cpuinfo"):
    """Whether the CPU has an int8 dot-product instruction (AVX-512 VNNI, AVX-VNNI or AMX). Without
    one, ONNX Runtime's uint8 x int8 kernel adds pairs of products in 16 bits, which saturate."""
    flags = next((line.split(":", 1)[1].split() for line in (_read(cpuinfo) or "").splitlines()
                  if line.startswith("flags")), [])
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags))


def cgroup_cpu_quota(root, proc_cgroup):
    """The tightest CPU quota (in CPUs) on this process's cgroup path, or None without one.
    `proc_cgroup` is the text of /proc/self/cgroup."""
    quotas = []
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2: one unified hierarchy
            quotas += [_v2_quota(folder) for folder in _folders(root, path)]
        elif "cpu" in controllers.split(","):      # cgroup v1: the cpu controller's own hierarchy
            mount = next((root / name for name in (controllers, "cpu,cpuacct", "cpu") if (root / name).is_dir()), None)
            if mount is not None:
                quotas += [_v1_quota(folder) for folder in _folders(mount, path)]
    quotas = [quota for quota in quotas if quota is not None]
    return min(quotas) if quotas else None


def _folders(mount, path):
    """The cgroup's folder and each ancestor's, up to the mount point. Inside a container the path
    from /proc/self/cgroup is often the host's, and the mount shows the container's own cgroup at
    its root, so the root is always looked at."""
    parts = [part for part in path.split("/") if part and part != ".."]
    return [mount.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _v2_quota(folder):
    fields = (_read(folder / "cpu.max") or "").split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    return _ratio(fields[0], fields[1])


def _v1_quota(folder):
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if quota is None or period is None or quota.strip() == "-1":
        return None
    return _ratio(quota, period)


def _ratio(quota, period):
    try:
        quota, period = int(quota), int(period)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _read(path):
    try:
        return Path(path).read_text()
    except OSError:
        return None
