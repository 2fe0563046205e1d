"""The figure of one planning step (`parcae plan --plot`): what the forecast allows in each interval of the
look-ahead, the strategy the plan takes there, and its liveput against its throughput.

Owns: `plot_plan`. Must not touch: the planning itself (`optimizer.plan_interval`: this draws what it returned).

Left: the instances each interval may bring (prev_available + n_in - n_out, one dot per event of the forecast, its
size the event's probability) and the D x P the plan takes there. Right: per interval, the throughput of the
plan's strategy if no instance went (the profile's samples/s) against its liveput (the plan's expected samples of
the interval over its length: the preemption scenarios and every migration's cost counted), and the same two for
the strategies the decision beat in the coming interval. The gap between the bars is what the scenarios cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from liveput.plan_input import PlanInput
from liveput.throughput import strategy_text


def plot_plan(inp: PlanInput, plan: Mapping[str, Any], path: str | Path, title: str = "") -> Path:
    """Draw `plan` (as `plan_of_input` returns it) of `inp` at `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    T = inp.interval_s
    steps = plan["steps"]
    K = len(steps)

    def throughput(strategy: Any) -> float:
        d, p = strategy
        return inp.profile.throughput(d, p) if d and p and inp.profile.is_feasible(d, p) else 0.0

    fig, (ax_n, ax_l, ax_a) = plt.subplots(
        1, 3, figsize=(13, 4.2), width_ratios=[1.15, 1.0, 1.0], constrained_layout=True
    )
    # the look-ahead: what each interval may bring, and the plan's D x P
    ks = range(1, K + 1)
    for k, f in zip(ks, inp.forecast, strict=True):
        for n_in, n_out, w in f.events:
            if w > 0:
                ax_n.scatter(k, f.prev_available + n_in - n_out, s=20 + 400 * w, color="tab:grey", alpha=0.55, lw=0)
                if 0.0 < w < 1.0:
                    ax_n.annotate(f"{w:.0%}", (k, f.prev_available + n_in - n_out), xytext=(8, -10),
                                  textcoords="offset points", fontsize=7, color="dimgrey")  # fmt: skip
    used = [s["strategy"][0] * s["strategy"][1] for s in steps]
    now = inp.state.strategy[0] * inp.state.strategy[1]
    ax_n.plot([0, *ks], [now, *used], "o-", color="tab:blue", lw=2, ms=4, label="the plan's D x P (0: now)")
    for k, s in zip(ks, steps, strict=True):
        d, p = s["strategy"]
        ax_n.annotate(strategy_text((d, p)), (k, d * p), xytext=(-10, 6), textcoords="offset points", fontsize=8,
                      color="tab:blue")  # fmt: skip
    ax_n.scatter([], [], s=60, color="tab:grey", alpha=0.55, lw=0, label="instances the forecast allows")
    ax_n.set_xlabel(f"interval of the look-ahead ({T:g} s each; 0 = now)")
    ax_n.set_ylabel("instances")
    ax_n.set_title("What the forecast allows, and the plan", fontsize=10)
    ax_n.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncol=2)
    ax_n.set_xticks([0, *ks])
    ax_n.margins(y=0.15)
    # per interval: the plan's strategy, its throughput if no instance went against its liveput
    tput = [throughput(s["strategy"]) for s in steps]
    live = [s["expected_samples"] / T for s in steps]
    ax_l.bar([k - 0.2 for k in ks], tput, width=0.4, color="tab:grey", alpha=0.5, label="throughput, nothing preempted")
    ax_l.bar([k + 0.2 for k in ks], live, width=0.4, color="tab:blue", label="liveput (expected)")
    ax_l.set_xticks(list(ks))
    ax_l.set_xlabel("interval of the look-ahead")
    ax_l.set_ylabel("samples/s")
    ax_l.set_title("The plan: throughput against liveput", fontsize=10)
    ax_l.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncol=2)
    # the coming interval: the decision against the strategies it beat there
    alts = list(plan.get("alternatives", []))
    decision = list(plan["decision"])
    if decision not in [a["strategy"] for a in alts]:
        alts.append({"strategy": decision, "expected_samples": steps[0]["expected_samples"]})
    labels = [strategy_text(a["strategy"]) for a in alts]
    y = range(len(alts))
    ax_a.barh([i + 0.2 for i in y], [throughput(a["strategy"]) for a in alts], height=0.4, color="tab:grey",
              alpha=0.5, label="throughput, nothing preempted")  # fmt: skip
    colours = ["tab:orange" if a["strategy"] == decision else "tab:blue" for a in alts]
    ax_a.barh([i - 0.2 for i in y], [a["expected_samples"] / T for a in alts], height=0.4, color=colours)
    ax_a.barh([], [], color="tab:blue", label="liveput of the coming interval")  # the legend's entry
    ax_a.set_yticks(list(y), [f"{lab} (decided)" if a["strategy"] == decision else lab
                              for lab, a in zip(labels, alts, strict=True)])  # fmt: skip
    ax_a.invert_yaxis()
    ax_a.set_xlabel("samples/s")
    ax_a.set_title("The coming interval: the decision (orange)", fontsize=10)
    ax_a.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, ncol=1)
    fig.suptitle(title or f"{inp.model}: a plan over {K} intervals from {strategy_text(inp.state.strategy)}")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
