"""The machine under a benchmark: its other load while the benchmark ran (other processes, the
hypervisor's steal), its fp32 matmul peak at the workload's shapes and the share of it reached, and
this process's peak memory — what makes a figure comparable with another host's (docs/benchmarks.md
"Hosts")."""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import NamedTuple

import torch

from ..runtime import peak
from .bench_workloads import Shape


def peak_rss_mb() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class HostCPU(NamedTuple):
    """CPU time of the whole machine since boot, in clock ticks (``/proc/stat``): ``busy`` (user,
    nice, system, irq, softirq: any process's work), ``steal`` (taken by the hypervisor), ``total``."""

    busy: int
    steal: int
    total: int


def host_cpu() -> HostCPU | None:
    """The machine's CPU counters now; None where there is no ``/proc/stat`` (not Linux)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    fields += [0] * (8 - len(fields))  # old kernels lack irq/softirq/steal
    # guest time (fields 9-10) is already inside user/nice, so only the first eight add up.
    idle, steal = fields[3] + fields[4], fields[7]
    return HostCPU(busy=sum(fields) - idle - steal, steal=steal, total=sum(fields))


def own_cpu_s() -> float:
    """CPU seconds (user + system, all threads) this process has used."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def host_load(before: HostCPU | None, after: HostCPU | None, own_s: float) -> dict[str, float]:
    """What else used the machine between two :func:`host_cpu` readings while this process used
    ``own_s`` CPU seconds: ``other_cpu_share`` (other processes' CPU time) and ``steal_share`` (the
    hypervisor's), each as a share of the machine's CPU time. A benchmark is only as good as these
    are small; empty where the counters are unavailable."""
    if before is None or after is None or after.total <= before.total:
        return {}
    total = after.total - before.total
    own = own_s * os.sysconf("SC_CLK_TCK")
    return {"other_cpu_share": round(max(after.busy - before.busy - own, 0.0) / total, 3),
            "steal_share": round((after.steal - before.steal) / total, 3)}


def host_peak_of(shape: Shape, cfg, prompt_len: float, response_len: float, threads: int) -> dict[str, float]:
    """The host's fp32 matmul peak (:mod:`ppo_lm.runtime.peak`) at the workload's update shapes — a
    minibatch's tokens through each linear layer — and at 2048³, and nothing on another device, whose
    peak this does not measure."""
    if cfg.model.device != "cpu":
        return {}
    episodes = cfg.rollout.num_prompts * cfg.rollout.samples_per_prompt
    rows = max(round(episodes / cfg.optim.num_minibatches * (prompt_len + response_len)), 1)
    kv_width = shape.hidden // shape.heads * shape.kv_heads
    return peak.host_peak(peak.decoder_shapes(rows, shape.hidden, shape.intermediate, kv_width),
                          threads or torch.get_num_threads())


def peak_fractions(host: dict[str, float], update_gflop_per_s: float, iteration_gflop_per_s: float) -> dict[str, float]:
    """How much of the host's best matmul speed (the faster backend of ``host``, from
    :func:`host_peak_of`) the update and the whole iteration reached, at the workload's shapes and at
    2048³: a figure that can be set beside another host's."""
    out = {}
    for suffix in ("", f"_{peak.REFERENCE}"):
        best = max((v for k, v in host.items() if k.endswith(f"_gflop_per_s{suffix}")), default=0.0)
        if best > 0:
            out[f"update_of_peak{suffix}"] = round(update_gflop_per_s / best, 3)
            out[f"iteration_of_peak{suffix}"] = round(iteration_gflop_per_s / best, 3)
    return out
