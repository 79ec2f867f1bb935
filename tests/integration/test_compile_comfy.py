"""Patched models under ComfyUI's TorchCompileModel (issue 11): KSampler through torch.compile on a random-weight U-Net.

TorchCompileModel is `comfy_api.torch_helpers.set_torch_compile_wrapper(model, backend)`: an APPLY_MODEL wrapper that
swaps in `torch.compile(diffusion_model)`. Our attn1 patches then run inside the traced U-Net. The test compiles with
a counting backend (dynamo's graphs, each run eagerly: no C compiler needed, fast on 2 cores) and checks that
- the patched, compiled run matches the patched eager run, and the preset still reduces tokens (telemetry);
- the patched U-Net compiles whole, to one graph like the unpatched one: once per model call, eagerly, a
  DIFFUSION_MODEL wrapper hands the patches a frozen table of what each attention call does (scheduling/patches.py
  build_unet_hooks), so they trace to the K/V pooling or to nothing. The first model call of a step window runs
  eagerly, whole, to fill that table. Before the table the patches were graph breaks in every call (39 graphs, the
  block-calling frame past dynamo's recompile limit and eager for the whole run: 0.58x-0.63x of the compiled
  unpatched step on the quick bench, issue 11);
- the step cache (Schedule.cache_*), alone or with `balanced`, compiles to two graphs, the full U-Net and the shallow
  forward of a cached step, whatever the number of steps, and reports the same attention telemetry as eager. Its
  host logic (which step, which condition group, the counters) runs eagerly, one graph break before each call and one
  after a full call. Traced, it made dynamo guard on the per-step state and recompile every step (7 graphs for 7
  steps, and past the recompile limit in a 20-step run).
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tokenfuse.nodes.glue import patcher
from tokenfuse.nodes.model_patching import schedule_model
from tokenfuse.nodes.scheduler_node import TokenSchedulerController, schedule_from_widgets

pytestmark = pytest.mark.integration
SIZE = 128
CACHE = '{"cache_interval": 3, "cache_depth": 2}'
CACHE_STEPS = 7  # interval 3: full at 0, 3, 6, cached at 1, 2, 4, 5


def ksample(comfy: SimpleNamespace, model: Any, steps: int = 2) -> torch.Tensor:
    pos = comfy.models.conditioning("sd15", seed=1, tiny=True)
    neg = comfy.models.conditioning("sd15", seed=2, tiny=True)
    latent = {"samples": torch.zeros(1, 4, SIZE // 8, SIZE // 8)}
    (out,) = comfy.nodes.common_ksampler(model, 0, steps, 2.0, "euler", "normal", pos, neg, latent)
    samples: torch.Tensor = out["samples"]
    assert torch.isfinite(samples).all()
    return samples


def compiled(comfy: SimpleNamespace, model: Any, graphs: list[Any]) -> Any:
    """model.clone() with ComfyUI's TorchCompileModel wrapper, compiled by a backend that counts dynamo's graphs."""

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    return comfy.models.torch_compiled(model, counting_backend)


@pytest.mark.parametrize("strategy", ["preset", "topk"])
def test_balanced_runs_under_torch_compile(comfy, random_model, strategy: str) -> None:
    """`balanced` (K/V pooling) and balanced/topk (top-K K/V, calibration off so that it reduces here)."""
    torch._dynamo.reset()
    model = random_model("sd15")
    schedule = schedule_from_widgets("balanced", strategy, 0.0, "sd15")
    if strategy == "topk":
        schedule = replace(schedule, device_aware=False)
    eager_patched, _ = schedule_model(model, schedule, patcher.detect_family(model))
    eager = ksample(comfy, eager_patched)

    base_graphs: list[Any] = []
    ksample(comfy, compiled(comfy, model, base_graphs))
    torch._dynamo.reset()

    patched, telemetry = schedule_model(model, schedule, patcher.detect_family(model))
    ours_graphs: list[Any] = []
    model_compiled = compiled(comfy, patched, ours_graphs)
    out = ksample(comfy, model_compiled)
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
    summary = telemetry.summary()
    assert summary["reduced_calls"] > 0 and summary["kv_tokens_out"] < summary["kv_tokens_in"]
    first_run = len(ours_graphs)
    again = ksample(comfy, model_compiled)  # the tables are learnt: no eager call, no new graph
    torch.testing.assert_close(again, eager, rtol=1e-4, atol=1e-4)
    assert telemetry.summary()["reduced_calls"] == summary["reduced_calls"]
    print(
        f"dynamo graphs ({strategy}): unpatched {len(base_graphs)}, patched {first_run}, "
        f"after a second run {len(ours_graphs)}"
    )
    assert len(base_graphs) == len(ours_graphs) == first_run == 1, "the patches break the compiled U-Net"
    assert len(ours_graphs[0].graph.nodes) > len(base_graphs[0].graph.nodes), "no K/V pooling in the graph"


@pytest.mark.parametrize("preset", ["lowvram_8gb", "lowvram_4gb"])
def test_lowvram_presets_compile_whole(comfy, random_model, caplog, preset: str) -> None:
    """The lowvram presets adapt their ratio to the content (eagerly to the previous step's statistic). Compiled, the
    first model call's adapted kernels are held for the run (one warning says so): one graph, like the unpatched
    U-Net, where each attention call used to be a graph break (0.53x-0.58x of the compiled unpatched quick step)."""
    torch._dynamo.reset()
    model = random_model("sd15")
    patched, telemetry = schedule_model(
        model, schedule_from_widgets(preset, "preset", 0.0, "sd15"), patcher.detect_family(model)
    )
    graphs: list[Any] = []
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        ksample(comfy, compiled(comfy, patched, graphs), steps=4)
    summary = telemetry.summary()
    assert summary["calls"] > 0 and summary["reduced_calls"] > 0 and summary["kv_tokens_out"] < summary["kv_tokens_in"]
    messages = [r.getMessage() for r in caplog.records if "under torch.compile" in r.getMessage()]
    print(f"dynamo graphs, {preset}: {len(graphs)}; {messages}")
    assert len(graphs) == 1, f"{len(graphs)} graphs: the adaptive ratio broke the compiled U-Net"
    assert len(messages) == 1 and "adaptive ratio" in messages[0], messages


def test_tome_compiles_whole(comfy, random_model, caplog) -> None:
    """balanced/tome (calibration off so that it merges here): the learning call's src/dst partition is held per step
    window, so merge and unmerge trace into the compiled U-Net: one graph, one warning; it still merges."""
    torch._dynamo.reset()
    model = random_model("sd15")
    schedule = replace(schedule_from_widgets("balanced", "tome", 0.0, "sd15"), device_aware=False)
    patched, telemetry = schedule_model(model, schedule, patcher.detect_family(model))
    graphs: list[Any] = []
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        ksample(comfy, compiled(comfy, patched, graphs), steps=4)
    summary = telemetry.summary()
    assert summary["reduced_calls"] > 0 and summary["q_tokens_out"] < summary["q_tokens_in"], summary
    messages = [r.getMessage() for r in caplog.records if "under torch.compile" in r.getMessage()]
    print(f"dynamo graphs, balanced/tome: {len(graphs)}; {messages}")
    assert len(graphs) == 1, f"{len(graphs)} graphs: tome broke the compiled U-Net"
    assert len(messages) == 1 and "tome's src/dst partition" in messages[0], messages


@pytest.mark.parametrize("preset", ["off", "balanced"])
def test_step_cache_runs_under_torch_compile(comfy, random_model, caplog, preset: str) -> None:
    """ours (cache) and ours (both) compiled: the same samples and the same full/cached split as eager; the cache alone
    adds no graph per step (2 graphs: the full U-Net and the cached step's shallow forward)."""
    torch._dynamo.reset()
    patched, _ = TokenSchedulerController().apply(random_model("sd15"), preset, "preset", 0.0, schedule_text=CACHE)
    split = "step cache 3 full / 4 cached U-Net calls of 7"
    with caplog.at_level(logging.INFO, logger="tokenfuse"):
        eager = ksample(comfy, patched, steps=CACHE_STEPS)
        caplog_eager = [r.getMessage() for r in caplog.records if split in r.getMessage()]
        caplog.clear()
        graphs: list[Any] = []
        out = ksample(comfy, compiled(comfy, patched, graphs), steps=CACHE_STEPS)
        caplog_compiled = [r.getMessage() for r in caplog.records if split in r.getMessage()]
    assert len(caplog_eager) == 1
    assert len(caplog_compiled) == 1, "compiled run: another full/cached split"
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
    # the attention telemetry of traced calls is replayed per call; cached steps count only their shallow blocks
    tokens = re.compile(r"[\d.]+% q\+k/v tokens saved, [\d.]+% attention pairs saved, \d+/\d+ attention calls reduced")
    assert [tokens.findall(m) for m in caplog_compiled] == [tokens.findall(m) for m in caplog_eager]
    print(f"dynamo graphs, step cache with preset {preset}: {len(graphs)}")
    assert len(graphs) == 2, f"{len(graphs)} graphs for {CACHE_STEPS} steps: a recompile per step or a graph break"


@pytest.mark.parametrize("preset", ["balanced", "lowvram_4gb"])
def test_dit_override_runs_under_torch_compile(comfy, random_model, caplog, preset: str) -> None:
    """Flux with `balanced` / `lowvram_4gb` (the attention override keeps the top-K keys/values, half / a quarter):
    compiled, the same samples and the same telemetry as eager, and no graph per step."""
    torch._dynamo.reset()
    model = random_model("flux")
    patched, _ = TokenSchedulerController().apply(model, preset, "preset", 0.0, schedule_text='{"protect_blocks": 0}')
    steps = 5

    def flux_sample(m: Any) -> torch.Tensor:
        pos = comfy.models.conditioning("flux", seed=1, tiny=True)
        neg = comfy.models.conditioning("flux", seed=2, tiny=True)
        latent = {"samples": torch.zeros(1, comfy.models.latent_channels("flux"), SIZE // 8, SIZE // 8)}
        (out,) = comfy.nodes.common_ksampler(m, 0, steps, 2.0, "euler", "normal", pos, neg, latent)
        return out["samples"]

    lines = re.compile(r"[\d.]+% q\+k/v tokens saved, [\d.]+% attention pairs saved, \d+/\d+ attention calls reduced")
    with caplog.at_level(logging.INFO, logger="tokenfuse"):
        eager = flux_sample(patched)
        eager_lines = [lines.findall(r.getMessage()) for r in caplog.records if lines.search(r.getMessage())]
        caplog.clear()
        graphs: list[Any] = []
        out = flux_sample(compiled(comfy, patched, graphs))
        compiled_lines = [lines.findall(r.getMessage()) for r in caplog.records if lines.search(r.getMessage())]
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
    assert compiled_lines == eager_lines and "0/0" not in str(eager_lines)
    print(f"dynamo graphs, Flux with {preset}: {len(graphs)} for {steps} steps")
    assert len(graphs) == 1, f"{len(graphs)} graphs for {steps} steps: a recompile per step"


def test_flux_with_face_crop_plans_under_torch_compile(comfy, random_model, caplog) -> None:
    """ScheduledFusion's path on Flux: one scheduled model, each face crop's TOKEN_PLAN set on a clone of it. Compiled,
    each plan gives the samples and telemetry eager gives (the second plan, protecting every pixel, reduces nothing);
    the replayed telemetry of the first plan's calls was reported for the second."""
    from tokenfuse.scheduling.keys import PLAN_KEY
    from tokenfuse.scheduling.plan import TokenPlan

    h, w = 136, 104  # latent 17 x 13: Flux's 9 x 7 token grid
    imp = torch.full((1, h, w), 0.1)
    imp[:, 20:80, 20:70] = 1.0
    plans = [TokenPlan(imp, (h, w)), TokenPlan(torch.ones(1, h, w), (h, w))]
    patched, _ = TokenSchedulerController().apply(random_model("flux"), "balanced", "preset", 0.0)

    def run(m: Any) -> tuple[list[torch.Tensor], list[str]]:
        caplog.clear()
        outs = []
        for plan in plans:
            c = m.clone()
            patcher.set_transformer_option(c, PLAN_KEY, plan)
            pos = comfy.models.conditioning("flux", seed=1, tiny=True)
            neg = comfy.models.conditioning("flux", seed=2, tiny=True)
            latent = {"samples": torch.zeros(1, comfy.models.latent_channels("flux"), h // 8, w // 8)}
            outs.append(comfy.nodes.common_ksampler(c, 0, 3, 2.0, "euler", "normal", pos, neg, latent)[0]["samples"])
        saved = re.compile(r"[\d.]+% q\+k/v tokens saved")
        return outs, [m.group(0) for r in caplog.records if (m := saved.search(r.getMessage()))]

    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="tokenfuse"):
        eager, eager_lines = run(patched)
        out, compiled_lines = run(compiled(comfy, patched, []))
    for a, b in zip(out, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert compiled_lines == eager_lines and eager_lines[1].startswith("0.0%") and eager_lines[0] != eager_lines[1]
