"""The attn1 patches under torch.compile (issue 11 §1: "no graph break caused by our patches inside a compiled block").

ComfyUI's TorchCompileModel compiles the whole diffusion model, DIFFUSION_MODEL wrappers and attention patches
included. A small module here follows that call chain (UNetModel.forward -> wrapper -> _forward; per transformer block
a fresh extra_options dict, the attn1 patch list, attention, the attn1 output patch list) and is compiled with a
backend that counts dynamo's graphs and runs them as traced (no C compiler, fast on 2 cores).

With `build_unet_hooks`' wrapper the first model call of a step window runs eagerly, whole (the patches fill their
table; traced, its graph breaks would compile fragments and use up dynamo's recompile limits), and every later call
of that window runs one graph holding all the attention of the U-Net, pooled K/V included. With the patches alone (no
wrapper) every patch call stays a graph break. tests/integration/test_compile_comfy.py runs the real U-Net.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tokenfuse.scheduling.dit_override import build_dit_hooks
from tokenfuse.scheduling.keys import PLAN_KEY, STEP_KEY
from tokenfuse.scheduling.patches import build_unet_hooks
from tokenfuse.scheduling.plan import TokenPlan
from tokenfuse.scheduling.schedule import Schedule
from tokenfuse.scheduling.step_state import SamplingSteps
from tokenfuse.scheduling.telemetry import RunTelemetry
from torch import nn

LEVELS = [8, 8, 16, 32, 16, 8]  # the blocks' token levels, in call order (/8 = the latent grid)
STEPS = 8
SAMPLE_SIGMAS = torch.linspace(14.6, 0.0, STEPS + 1)
# reduce /8 and /16 in the first half of sampling, protect the first transformer block: two step windows
SCHEDULE = Schedule(strategy="todo", ratios={8: 0.75, 16: 0.75}, protect_blocks=1, end_percent=0.5)


class TokenNet(nn.Module):
    """UNetModel's attention call pattern on a latent [B, 4, H, W]: per block, tokens of its level -> attn1 patches ->
    SDPA -> attn1 output patches; returns [B, len(LEVELS), 4] (each block's mean attention output)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.ModuleList(nn.Linear(4, 4) for _ in LEVELS)

    def _forward(self, x, timesteps, context, y, control, transformer_options):  # ComfyUI's argument order
        opts = transformer_options
        opts["original_shape"] = list(x.shape)
        patches = opts.get("patches", {})
        outs = []
        for i, level in enumerate(LEVELS):
            grid = F.avg_pool2d(x, level // 8) if level > 8 else x
            n = self.proj[i](grid.flatten(2).transpose(1, 2))  # [B, N, C]
            extra = {k: v for k, v in opts.items() if k != "patches"}  # BasicTransformerBlock: a fresh dict per call
            extra.update(block=("input", i), block_index=0, transformer_index=i)
            ctx = val = n
            for p in patches.get("attn1_patch", []):
                n, ctx, val = p(n, ctx, val, extra)
            a = F.scaled_dot_product_attention(n, ctx, val)
            for p in patches.get("attn1_output_patch", []):
                a = p(a, extra)
            outs.append(a.mean(dim=1))
        return torch.stack(outs, dim=1)


class Executor:
    def __init__(self, net: TokenNet) -> None:
        self.class_obj = net

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.class_obj._forward(*args, **kwargs)


class Forward(nn.Module):
    """UNetModel.forward: the DIFFUSION_MODEL wrapper (when given) around _forward, as TorchCompileModel compiles it."""

    def __init__(self, net: TokenNet, wrapper: Any) -> None:
        super().__init__()
        self.net, self.wrapper = net, wrapper

    def forward(self, *args: Any) -> Any:
        if self.wrapper is None:
            return self.net._forward(*args)
        return self.wrapper(Executor(self.net), *args)


def sample(
    forward: Any,
    hooks: Any,
    after_call: Any = None,
    plan: TokenPlan | None = None,
    sigma_steps: list[int] | None = None,
    before: tuple[Any, ...] = (),
) -> list[torch.Tensor]:
    """STEPS model calls as a sampler makes them: a new sigmas tensor and transformer_options per call (sigma_steps:
    the step whose sigma each call carries, default its own; before: other packs' attn1 patches, run before ours)."""
    x = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    outs = []
    with torch.no_grad():
        for step in range(STEPS):
            opts = {
                "patches": {
                    "attn1_patch": [*before, hooks.attn1_patch],
                    "attn1_output_patch": [hooks.attn1_output_patch],
                },
                "sigmas": SAMPLE_SIGMAS[(sigma_steps or range(STEPS))[step] :][:1].clone(),
                "sample_sigmas": SAMPLE_SIGMAS,
            }
            if plan is not None:
                opts[PLAN_KEY] = plan
            outs.append(forward(x, SAMPLE_SIGMAS[step : step + 1], None, None, None, opts))
            if after_call is not None:
                after_call(step)
    return outs


def counting_compile(module: nn.Module, graphs: list[torch.fx.GraphModule]) -> Any:
    def counting(gm: torch.fx.GraphModule, _inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    return torch.compile(module, backend=counting)


def sdpa_calls(gm: torch.fx.GraphModule) -> int:
    return sum(1 for node in gm.graph.nodes if node.target is F.scaled_dot_product_attention)


def pooled_sdpa_calls(gm: torch.fx.GraphModule) -> int:
    """Attention calls in the graph whose keys have fewer tokens than their queries."""
    n = 0
    for node in gm.graph.nodes:
        if node.target is F.scaled_dot_product_attention:
            q, k = (a.meta["example_value"] for a in node.args[:2])
            n += int(k.shape[1] < q.shape[1])
    return n


def run_compiled(
    schedule: Schedule, with_wrapper: bool, before: tuple[Any, ...] = ()
) -> tuple[list[torch.Tensor], list[Any], list[int], Any]:
    """(outputs, graphs, graph count after each call, telemetry summary) of a compiled sampling run."""
    net = TokenNet().eval()
    hooks = build_unet_hooks(schedule, telemetry := RunTelemetry())
    graphs: list[torch.fx.GraphModule] = []
    forward = counting_compile(Forward(net, hooks.diffusion_model_wrapper if with_wrapper else None), graphs)
    after: list[int] = []
    try:
        outs = sample(forward, hooks, lambda _step: after.append(len(graphs)), before=before)
    finally:
        torch._dynamo.reset()
    return outs, graphs, after, telemetry.summary()


def run_eager(
    schedule: Schedule, before: tuple[Any, ...] = (), sigma_steps: list[int] | None = None
) -> tuple[list[torch.Tensor], Any]:
    net = TokenNet().eval()
    hooks = build_unet_hooks(schedule, telemetry := RunTelemetry())
    forward = Forward(net, hooks.diffusion_model_wrapper)
    return sample(forward, hooks, before=before, sigma_steps=sigma_steps), telemetry.summary()


# tome's partition is held per step window when compiled: its eager twin is a run whose active window's calls all
# carry the window's first step (SCHEDULE's window: steps 0-3)
WINDOW_START = [0] * (STEPS // 2) + list(range(STEPS // 2, STEPS))


def scatter_merges(gm: torch.fx.GraphModule) -> int:
    """tome merges traced in a graph (bipartite_soft_matching_2d's scatter_reduce)."""
    return sum(1 for node in gm.graph.nodes if "scatter_reduce" in str(node.target))


@pytest.mark.parametrize("strategy", ["todo", "topk"])
def test_compiled_patches_trace_into_one_graph_per_step_window(caplog, strategy: str) -> None:
    """Per window: one eager learning call, then one graph with every block's attention and nothing else compiled,
    no new graph per step; the same outputs and the same telemetry (tokens per call) as eager; no warning. K/V
    pooling (todo) and top-K K/V (topk: a fixed count, selected in the graph from the tokens) alike."""
    schedule = replace(SCHEDULE, strategy=strategy)
    ref, ref_summary = run_eager(schedule)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        outs, graphs, after, summary = run_compiled(schedule, with_wrapper=True)
    assert not [r for r in caplog.records if "under torch.compile" in r.getMessage()]
    for step, (a, b) in enumerate(zip(outs, ref, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step}")
    assert [sdpa_calls(gm) for gm in graphs] == [len(LEVELS)] * 2, "one whole graph per step window, no fragment"
    assert [pooled_sdpa_calls(gm) for gm in graphs] == [4, 0], "/8 and /16 pooled, bar the protected block"
    # steps 0-3 reduce, 4-7 do not: each window's first call runs eagerly, its second compiles, the rest reuse it
    assert after == [0, 1, 1, 1, 1, 2, 2, 2], f"graphs after each call: {after}"
    for key in ("calls", "reduced_calls", "kv_tokens_in", "kv_tokens_out"):
        assert summary[key] == ref_summary[key], key
    assert summary["reduced_calls"] > 0


def face_plan(top: int, size: int) -> TokenPlan:
    """A face-crop TOKEN_PLAN on the 128 px image: a protected square at (top, top) of `size` px."""
    imp = torch.full((1, 128, 128), 0.1)
    imp[:, top : top + size, top : top + size] = 1.0
    return TokenPlan(importance=imp, image_size=(128, 128))


@pytest.mark.parametrize(
    ("strategy", "adaptive"), [("todo", 0.0), ("todo", 0.2), ("topk", 0.0)], ids=["todo", "adaptive", "topk"]
)
def test_face_crop_plans_trace_too(strategy: str, adaptive: float) -> None:
    """ScheduledFusion's case: each crop brings its own plan, whose protected cells keep full-resolution K/V. Traced
    like the plain pooling (the cells' index tensors ride in the table): eager-equal outputs and telemetry, four
    crops of different face sizes as in a video, no graph per step (a new crop: one eager call; dynamo makes the index
    lengths dynamic after the second size, so later crops compile nothing)."""
    schedule = Schedule(strategy=strategy, ratios={8: 0.75, 16: 0.75}, protect_blocks=1, adaptive=adaptive)
    plans = [face_plan(32, 48), face_plan(40, 24), face_plan(24, 64), face_plan(36, 40)]
    net = TokenNet().eval()
    eager_hooks = build_unet_hooks(schedule, eager_tel := RunTelemetry())
    ref = [sample(Forward(net, eager_hooks.diffusion_model_wrapper), eager_hooks, plan=p) for p in plans]
    hooks = build_unet_hooks(schedule, tel := RunTelemetry())
    graphs: list[torch.fx.GraphModule] = []
    forward = counting_compile(Forward(net, hooks.diffusion_model_wrapper), graphs)
    after: list[list[int]] = [[] for _ in plans]
    try:
        outs = [
            sample(forward, hooks, lambda _s, a=a: a.append(len(graphs)), plan=p)
            for p, a in zip(plans, after, strict=True)
        ]
    finally:
        torch._dynamo.reset()
    print(f"graphs after each call, crop by crop: {after}")
    first = 1 if adaptive else 0  # eager keeps the base ratio at a run's first step (see the adaptive test below)
    for got, want in zip(outs, ref, strict=True):
        for a, b in zip(got[first:], want[first:], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for key in ("calls", "reduced_calls", "kv_tokens_in", "kv_tokens_out")[: 4 - first]:
        assert tel.summary()[key] == eager_tel.summary()[key], key
    assert after[0][0] == 0 and all(len(set(a[1:])) == 1 for a in after), f"graphs: {after}"
    assert after[-1][-1] <= 3 and after[-1][-1] == after[-2][-1], f"graphs: {after}"
    assert all(sdpa_calls(gm) == len(LEVELS) for gm in graphs), "a graph break in a traced call"
    assert all(pooled_sdpa_calls(gm) == 4 for gm in graphs), "/8 and /16 pooled around the face, bar block 0"


def other_pack_patch(n: torch.Tensor, ctx: Any, val: Any, extra_options: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Another pack's attn1 patch before ours: it hands on new K and V tensors (still n's tokens), two objects."""
    return n, ctx * 1.5, val + 0.25


@pytest.mark.parametrize("strategy", ["todo", "topk", "tome"])
def test_keys_values_from_another_patch_trace_too(strategy: str) -> None:
    """K/V that are not n any more (another pack's patch ran first) are reduced like the eager patch does (each tensor
    still holding n's tokens; todo/topk leave the queries, tome merges them with the same partition), inside the
    graph: one graph per step window, eager-equal outputs and telemetry (the eager fallback it replaces broke the
    graph at every call and counted its calls twice). tome holds its partition per window: compared with the eager
    run whose window calls all see the window's first step."""
    schedule = replace(SCHEDULE, strategy=strategy, ratios={8: 0.5, 16: 0.5} if strategy == "tome" else SCHEDULE.ratios)
    sigma_steps = WINDOW_START if strategy == "tome" else None
    ref, ref_summary = run_eager(schedule, before=(other_pack_patch,), sigma_steps=sigma_steps)
    outs, graphs, after, summary = run_compiled(schedule, with_wrapper=True, before=(other_pack_patch,))
    for step, (a, b) in enumerate(zip(outs, ref, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step}")
    assert after == [0, 1, 1, 1, 1, 2, 2, 2], f"graphs after each call: {after}"
    assert [sdpa_calls(gm) for gm in graphs] == [len(LEVELS)] * 2, "one whole graph per step window, no fragment"
    if strategy == "tome":
        # 4 reduced calls, each merging q, the other pack's K and its V (three tensors) with one partition
        assert [scatter_merges(gm) for gm in graphs] == [12, 0], "tome merges traced per graph"
    else:
        assert [pooled_sdpa_calls(gm) for gm in graphs] == [4, 0]
    for key in ("calls", "reduced_calls", "kv_tokens_in", "kv_tokens_out"):
        assert summary[key] == ref_summary[key], key


def test_without_the_wrapper_every_patch_call_breaks_the_graph() -> None:
    """What the wrapper is for: the patches alone are correct under compile but split the U-Net at every call."""
    ref, _ = run_eager(SCHEDULE)
    outs, graphs, _after, _summary = run_compiled(SCHEDULE, with_wrapper=False)
    for a, b in zip(outs, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert max(sdpa_calls(gm) for gm in graphs) <= 1


def test_adaptive_ratios_trace_held_per_step_window(caplog) -> None:
    """The lowvram presets' adaptive ratio (content-dependent; eagerly a step reads the statistic its previous step
    measured, a run's first step keeps the base ratio): under compile the learning call measures its own tokens and
    its adapted kernels are held for the step window, so the U-Net still compiles whole; one warning says so. The
    tokens are the same at every step here, so from step 1 on eager adapts to the same kernels: equal outputs."""
    schedule = Schedule(strategy="todo", ratios={8: 0.75, 16: 0.75}, protect_blocks=1, end_percent=0.5, adaptive=0.2)
    ref, ref_summary = run_eager(schedule)
    plain, plain_summary = run_eager(SCHEDULE)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        outs, graphs, after, summary = run_compiled(schedule, with_wrapper=True)
    for step, (a, b) in enumerate(zip(outs[1:], ref[1:], strict=True), start=1):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step}")
    torch.testing.assert_close(ref[0], plain[0], rtol=1e-5, atol=1e-5, msg="eager step 0: the base ratio")
    assert not torch.allclose(outs[0], ref[0], rtol=1e-5, atol=1e-5), "the adaptation changed no kernel: a weak test"
    assert after == [0, 1, 1, 1, 1, 2, 2, 2], f"graphs after each call: {after}"
    assert [sdpa_calls(gm) for gm in graphs] == [len(LEVELS)] * 2, "one whole graph per step window, no fragment"
    assert [pooled_sdpa_calls(gm) for gm in graphs] == [4, 0]
    for key in ("calls", "reduced_calls", "kv_tokens_in"):
        assert summary[key] == ref_summary[key], key
    assert summary["kv_tokens_out"] != plain_summary["kv_tokens_out"], "the adaptation changed no kernel: a weak test"
    messages = [r.getMessage() for r in caplog.records if "under torch.compile" in r.getMessage()]
    assert len(messages) == 1 and "adaptive ratio (adaptive 0.2) is chosen on the first model call" in messages[0]


@pytest.mark.parametrize("strategy", ["todo", "topk"])
def test_adaptive_ratio_is_held_not_remeasured_under_compile(strategy: str) -> None:
    """Tokens that change every step: eager re-adapts (a different kernel / kept count at some step, from the
    previous step's tokens), the compiled run keeps the learning call's for the window (the same K/V tokens per call
    at every step) and compiles no graph per step."""
    schedule = Schedule(strategy=strategy, ratios={8: 0.75}, protect_blocks=0, adaptive=0.3)
    net = TokenNet().eval()
    kv_out: dict[str, list[int]] = {}
    after: list[int] = []
    for mode in ("eager", "compiled"):
        hooks = build_unet_hooks(schedule, tel := RunTelemetry())
        graphs: list[torch.fx.GraphModule] = []
        forward = Forward(net, hooks.diffusion_model_wrapper)
        if mode == "compiled":
            forward = counting_compile(forward, graphs)
        per_step, last = [], 0
        try:
            with torch.no_grad():
                for step in range(STEPS):
                    # step 0 white noise (busy: less pooling), later ever smoother maps (flat: more pooling)
                    x = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(1))
                    for _ in range(step):
                        x = F.avg_pool2d(x, 3, stride=1, padding=1, count_include_pad=False)
                    opts = {
                        "patches": {
                            "attn1_patch": [hooks.attn1_patch],
                            "attn1_output_patch": [hooks.attn1_output_patch],
                        },
                        "sigmas": SAMPLE_SIGMAS[step : step + 1].clone(),
                        "sample_sigmas": SAMPLE_SIGMAS,
                    }
                    forward(x, SAMPLE_SIGMAS[step : step + 1], None, None, None, opts)
                    total = tel.summary()["kv_tokens_out"]
                    per_step.append(total - last)
                    last = total
                    if mode == "compiled":
                        after.append(len(graphs))
        finally:
            torch._dynamo.reset()
        kv_out[mode] = per_step
    assert len(set(kv_out["eager"])) > 1, f"eager never re-adapted, a weak test: {kv_out}"
    # eager step 1 adapts to what step 0 measured, the compiled learning call (step 0) to its own tokens
    assert len(set(kv_out["compiled"])) == 1 and kv_out["compiled"][0] == kv_out["eager"][1], kv_out
    assert after == [0] + [1] * (STEPS - 1), f"graphs after each call: {after}"


def test_tome_traces_with_its_partition_held_per_step_window(caplog) -> None:
    """tome merges the queries too and unmerges the attention output; its src/dst partition is re-drawn every step
    eagerly. Compiled, the learning call's partition is held for the step window, so merge and unmerge trace into one
    graph per window; equal to an eager run whose calls all see their window's first step; one warning says so."""
    schedule = Schedule(strategy="tome", ratios={8: 0.5, 16: 0.5}, protect_blocks=1, end_percent=0.5)
    net = TokenNet().eval()
    eager_hooks = build_unet_hooks(schedule, eager_tel := RunTelemetry())
    ref = sample(Forward(net, eager_hooks.diffusion_model_wrapper), eager_hooks, sigma_steps=WINDOW_START)
    plain, _ = run_eager(schedule)  # re-drawn every step: differs from the held partition
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        outs, graphs, after, summary = run_compiled(schedule, with_wrapper=True)
    for step, (a, b) in enumerate(zip(outs, ref, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step}")
    assert not torch.allclose(outs[1], plain[1], atol=1e-5), "the partition does not change per step: a weak test"
    assert after == [0, 1, 1, 1, 1, 2, 2, 2], f"graphs after each call: {after}"
    assert [sdpa_calls(gm) for gm in graphs] == [len(LEVELS)] * 2, "one whole graph per step window, no fragment"
    merged = [scatter_merges(gm) for gm in graphs]
    assert merged == [4, 0], f"tome merges traced per graph: {merged}"
    for key in ("calls", "reduced_calls", "kv_tokens_in", "kv_tokens_out"):
        assert summary[key] == eager_tel.summary()[key] and summary["reduced_calls"] > 0, key
    messages = [r.getMessage() for r in caplog.records if "under torch.compile" in r.getMessage()]
    assert len(messages) == 1 and "tome's src/dst partition is chosen on the first model call" in messages[0], messages


class DitNet(nn.Module):
    """A DiT's attention call pattern: per block, ComfyUI's optimized_attention_override(func, q, k, v, heads, ...,
    transformer_options=...) on the latent's tokens; returns [B, blocks, C]."""

    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.ModuleList(nn.Linear(4, 12) for _ in range(blocks))

    def _forward(self, x, timestep, context, y, guidance, control, transformer_options):  # Flux's argument order
        opts = transformer_options
        tokens = x.flatten(2).transpose(1, 2)  # [B, H*W, C]
        outs = []
        for i, proj in enumerate(self.proj):
            q, k, v = proj(tokens).chunk(3, dim=-1)
            block_opts = {**opts, "block_index": i}
            override = opts.get("optimized_attention_override")
            a = override(attention, q, k, v, 1, transformer_options=block_opts) if override else attention(q, k, v, 1)
            outs.append(a.mean(dim=1))
        return torch.stack(outs, dim=1)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, **_kw: Any) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def dit_sample(forward: Any, override: Any, after: list[int], graphs: list[Any]) -> list[torch.Tensor]:
    """STEPS model calls with the run's host-side step state, as ComfyUI's sampler path gives them (STEP_KEY)."""
    x = torch.randn(2, 4, 16, 16, generator=torch.Generator().manual_seed(1))
    state = SamplingSteps(SAMPLE_SIGMAS.tolist())
    outs = []
    with torch.no_grad():
        for step in range(STEPS):
            opts = {
                "optimized_attention_override": override,
                "sigmas": SAMPLE_SIGMAS[step : step + 1].clone(),
                "sample_sigmas": SAMPLE_SIGMAS,
                STEP_KEY: state,
            }
            outs.append(forward(x, SAMPLE_SIGMAS[step : step + 1], None, None, None, None, opts))
            after.append(len(graphs))
            state.advance(step)
    return outs


def test_dit_override_compiles_once_per_step_window() -> None:
    """The DiT override with its wrapper: each window state's first call eager, then one graph per window state, the
    same outputs and telemetry as eager. (Traced without the wrapper, the override read the run's step state: on real
    ComfyUI Flux that was a recompile per step, tests/integration/test_compile_comfy.py.)"""
    schedule = Schedule(strategy="topk", dit_ratio=0.5, protect_blocks=1, end_percent=0.5)
    net = DitNet().eval()
    eager_hooks = build_dit_hooks(schedule, eager_tel := RunTelemetry())
    ref = dit_sample(Forward(net, eager_hooks.diffusion_model_wrapper), eager_hooks.override, [], [])
    hooks = build_dit_hooks(schedule, tel := RunTelemetry())
    graphs: list[torch.fx.GraphModule] = []
    forward = counting_compile(Forward(net, hooks.diffusion_model_wrapper), graphs)
    after: list[int] = []
    try:
        outs = dit_sample(forward, hooks.override, after, graphs)
    finally:
        torch._dynamo.reset()
    for step, (a, b) in enumerate(zip(outs, ref, strict=True)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"step {step}")
    assert tel.summary()["reduced_calls"] == eager_tel.summary()["reduced_calls"] == 3 * STEPS // 2
    assert after == [0, 1, 1, 1, 1, 2, 2, 2], f"graphs after each call: {after}"
    assert [sdpa_calls(gm) for gm in graphs] == [4, 4], "one whole graph per window state"
