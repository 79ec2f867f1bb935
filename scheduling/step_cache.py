"""Step cache for U-Nets: reuse the deep features of the last full step, recompute only the shallow blocks.

DeepCache's observation (Ma et al., 2023): between neighbouring sampling steps a U-Net's deep (low-resolution)
features barely change, while the shallow high-resolution path carries the detail. So on a *full* step the whole
U-Net runs and the feature entering output block `n - depth` is kept; on a *cached* step only input blocks
`0 .. depth-1` and output blocks `n-depth .. n-1` run, the kept feature standing in for everything deeper.

Pure torch, no ComfyUI import. It hooks in only through ComfyUI's public extension points, like ComfyUI's own
EasyCache: a DIFFUSION_MODEL wrapper (decides per call: full = call the real forward untouched; cached = the shallow
forward below, on the model's own modules) and an `output_block_patch` (captures the deep feature during full steps).
Nothing in the model is replaced or mutated; the node layer (nodes/model_patching.py) attaches the hooks to a clone.

Which steps are full: the first and the last step, every step outside the sigma window, and inside the window one
step every `interval` (the `interval - 1` steps between reuse). With `threshold > 0` a cached step is promoted to a
full one when the model input moved too far since the last full step, measured on the face tokens only: in face
fusion the latent outside the noise mask is reset to the noised source every step, so its change says nothing about
whether the face's deep features are stale (the TOKEN_PLAN, when present, says where the face is).

Region-aware *compute* (recomputing deep features only for face tokens) is not done: the deep path is convolutions,
GroupNorm over the whole grid and attention, so a subset of tokens cannot be recomputed without changing every other
token's result; the saving on the background comes from the token patches (TOKEN_PLAN) on the shallow blocks instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from .compile_wrapper import eager_under_compile
from .keys import SHALLOW_KEY
from .step_state import run_steps
from .transfer import to_device

log = logging.getLogger(__name__)

# Sigmas of a run are matched to steps with this relative tolerance (schedules are float32 on the device).
SIGMA_RTOL = 1e-4
EmbedFn = Callable[..., torch.Tensor]
CacheKey = tuple[
    Any, ...
]  # (uuids, cond_or_uncond, x.shape) of a model call  # comfy.ldm.modules.diffusionmodules.util.timestep_embedding


def plan_full_steps(n_steps: int, interval: int, in_window: Sequence[bool]) -> list[bool]:
    """Which steps of a run are full (True) under a fixed interval, without threshold refreshes.

    n_steps: sampling steps (len(sample_sigmas) - 1); interval: one full step every `interval` inside the window
    (< 2 = every step full); in_window[i]: step i is inside the cache window. First and last step are always full.
    """
    full: list[bool] = []
    last_full = 0
    for i in range(n_steps):
        is_full = interval < 2 or i == 0 or i >= n_steps - 1 or not in_window[i] or i - last_full >= interval
        if is_full:
            last_full = i
        full.append(is_full)
    return full


def step_index(sigma: float, sample_sigmas: Sequence[float]) -> int:
    """The step a model call belongs to: i with sample_sigmas[i] >= sigma > sample_sigmas[i + 1] (a second-order
    sampler's intermediate sigma belongs to the step it started from). sample_sigmas: decreasing, ends at 0."""
    n_steps = max(1, len(sample_sigmas) - 1)
    count = sum(1 for s in sample_sigmas[:n_steps] if s >= sigma * (1.0 - SIGMA_RTOL))
    return min(max(count - 1, 0), n_steps - 1)


def face_drift(x: torch.Tensor, ref: torch.Tensor, weights: torch.Tensor | None) -> float:
    """Relative L1 change of the model input since the reference: sum w|x - ref| / sum w|ref| (one host sync).

    x, ref: [B, C, H, W]; weights: [B, H * W] in {0, 1} (face tokens) or None for every token.
    """
    diff = (x - ref).abs().mean(dim=1).flatten(1)  # [B, H*W]
    base = ref.abs().mean(dim=1).flatten(1)
    if weights is not None:
        w = weights.to(device=diff.device, dtype=diff.dtype)
        diff, base = diff * w, base * w
    return float(diff.sum() / base.sum().clamp_min(1e-12))


def shallow_forward(
    cache: _Cache, unet: Any, call: _CallPlan, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> torch.Tensor:
    """A cached step: ComfyUI's UNetModel._forward with the deep part replaced by `deep` (the cached `call`'s).

    args / kwargs: UNetModel.forward's executor call, (x, timesteps, context, y, control, transformer_options);
    the depth and the time embedding come from the clone's `cache`.

    Runs the time embedding (and its patches), input blocks 0..depth-1, then output blocks n-depth..n-1 on `deep`
    (the feature that entered output block n-depth at the last full step, [B, C_d, H_d, W_d]) and the skips of the
    input blocks just run, then `out`. Same block/patch/transformer_index bookkeeping as the real forward, so the
    attention patches see the blocks they would see on a full step. x: [B, C, H, W] -> [B, C_out, H, W].
    """
    deep, deep_transformer_index = call.deep, call.transformer_index
    if deep is None:
        raise ValueError("shallow_forward: a full call has no deep feature to reuse")
    depth, embed = cache.state.depth, cache.embed
    x, timesteps = args[0], args[1]
    context = args[2] if len(args) > 2 else kwargs.get("context")
    y = args[3] if len(args) > 3 else kwargs.get("y")
    transformer_options: dict[str, Any] = args[5] if len(args) > 5 else kwargs["transformer_options"]
    transformer_options["original_shape"] = list(x.shape)
    transformer_options["transformer_index"] = 0
    patches = transformer_options.get("patches", {})
    emb = unet.time_embed(embed(timesteps, unet.model_channels, repeat_only=False).to(x.dtype))
    for p in patches.get("emb_patch", ()):
        emb = p(emb, unet.model_channels, transformer_options)
    if unet.num_classes is not None:
        emb = emb + unet.label_emb(y)
    hs: list[torch.Tensor] = []
    h = x
    for i in range(depth):
        transformer_options["block"] = ("input", i)
        h = unet.input_blocks[i](h, emb, context, transformer_options)
        for p in patches.get("input_block_patch", ()):
            h = p(h, transformer_options)
        hs.append(h)
        for p in patches.get("input_block_patch_after_skip", ()):
            h = p(h, transformer_options)
    h = deep.clone()  # the output_block_patches (ours first, then e.g. FreeU's in-place scaling) see a fresh copy
    transformer_options["transformer_index"] = deep_transformer_index
    n = len(unet.output_blocks)
    for j in range(n - depth, n):
        transformer_options["block"] = ("output", j)
        hsp = hs.pop()
        for p in patches.get("output_block_patch", ()):
            h, hsp = p(h, hsp, transformer_options)
        h = torch.cat([h, hsp], dim=1)
        output_shape = hs[-1].shape if hs else None
        h = unet.output_blocks[j](h, emb, context, transformer_options, output_shape)
    out: torch.Tensor = unet.out(h.type(x.dtype))
    return out


@dataclass
class _Entry:
    """What a full step left for one group of conditions: deep feature, its transformer_index, model input."""

    deep: torch.Tensor | None = None
    transformer_index: int = 0
    x: torch.Tensor | None = None


class _CallPlan(NamedTuple):
    """One U-Net call's decision: key of its condition group; deep = the feature to reuse (cached) or None (full)."""

    key: CacheKey
    deep: torch.Tensor | None
    transformer_index: int


@dataclass
class StepCacheState:
    """Per-run state (reset by the node layer's OUTER_SAMPLE wrapper) and the run's counters.

    sigma_window: (start, end) sigmas; a step with end < sigma <= start is inside the window.
    """

    interval: int
    depth: int
    threshold: float
    sigma_window: tuple[float, float] = (float("inf"), 0.0)
    sample_sigmas: list[float] | None = None
    decided: dict[int, bool] = field(default_factory=dict)  # step -> full
    last_full: int = -1
    entries: dict[CacheKey, _Entry] = field(default_factory=dict)
    capture_block: int = -1  # the output block whose input is the deep feature (n - depth; constant per model)
    captured: torch.Tensor | None = None  # that input, written by the output patch during the current full call
    captured_index: int = 0
    full_calls: int = 0
    cached_calls: int = 0
    refreshed: int = 0  # cached steps promoted to full by the threshold
    fallback: str = ""  # why the cache stood aside this run ("" = it did not)

    def reset(self, sigma_window: tuple[float, float] | None = None) -> None:
        self.sigma_window = sigma_window or (float("inf"), 0.0)
        self.sample_sigmas = None
        self.decided.clear()
        self.last_full = -1
        self.entries.clear()  # drops the cached features: nothing outlives a run
        self.captured = None
        self.full_calls = self.cached_calls = self.refreshed = 0
        self.fallback = ""

    def summary(self) -> str:
        """One clause for the run's INFO line, e.g. 'step cache 8 full / 12 cached U-Net calls (depth 2, every 3)'."""
        total = self.full_calls + self.cached_calls
        text = (
            f"step cache {self.full_calls} full / {self.cached_calls} cached U-Net calls of {total} "
            f"(depth {self.depth}, every {self.interval}"
        )
        if self.threshold > 0:
            text += f", threshold {self.threshold:g}: {self.refreshed} refreshed"
        return text + (f"; full from a call on: {self.fallback})" if self.fallback else ")")


def _in_window(state: StepCacheState, sigma: float) -> bool:
    start, end = state.sigma_window
    return end < sigma <= start


def _face_weights(plan: Any, x: torch.Tensor) -> torch.Tensor | None:
    """[B, H*W] 1 on the plan's protected (face) tokens at the latent grid, or None without a usable plan."""
    if plan is None or not hasattr(plan, "level_importance"):
        return None
    # On the plan's own device (the host for a TokenPlan), so the emptiness check is no device sync.
    imp = plan.level_importance(x.shape[-2], x.shape[-1], x.shape[0])
    face = imp >= float(getattr(plan, "protect_threshold", 0.5))
    return to_device(face.to(x.dtype), x.device) if bool(face.any()) else None


@dataclass(frozen=True)
class StepCacheHooks:
    """What the node layer attaches to a ModelPatcher clone: the DIFFUSION_MODEL wrapper and the
    output_block_patch; `state` is reset per run and read for the summary."""

    state: StepCacheState
    diffusion_model_wrapper: Callable[..., Any]
    output_block_patch: Callable[..., Any]


@dataclass
class _Cache:
    """What the step cache's hooks share for one model clone: the run's state and the settings the node layer passes
    (see `build_step_cache`), and the reasons already logged."""

    state: StepCacheState
    embed: EmbedFn
    plan_key: str
    disabled_key: str
    step_key: str | None
    warned: set[str] = field(default_factory=set)


def _stand_aside(cache: _Cache, reason: str) -> None:
    cache.state.fallback = reason
    if reason not in cache.warned:
        cache.warned.add(reason)
        log.info("TokenFuse step cache: every U-Net call full from here on in this run (%s)", reason)


def _is_full_step(cache: _Cache, step: tuple[int, int, float], x: torch.Tensor, key: CacheKey, plan: Any) -> bool:
    """Whether step i runs the whole U-Net (decided once per step; the threshold can promote a cached step).

    step: (step i, steps, sigma) of the call, as `_step_of` returns it."""
    i, n_steps, sigma = step
    state = cache.state
    if i not in state.decided:
        full = (
            i == 0
            or i >= n_steps - 1
            or not _in_window(state, sigma)
            or state.last_full < 0
            or i - state.last_full >= state.interval
        )
        entry = state.entries.get(key)
        if not full and state.threshold > 0 and entry is not None and entry.x is not None:
            if face_drift(x, entry.x, _face_weights(plan, x)) > state.threshold:
                full = True
                state.refreshed += 1
        state.decided[i] = full
        if full:
            state.last_full = i
    return state.decided[i]


def _unsupported(cache: _Cache, unet: Any, opts: dict[str, Any], control: Any, kwargs: dict[str, Any]) -> str:
    """Why the cache stands aside for this call ("" when it does not)."""
    n_blocks, depth = len(getattr(unet, "output_blocks", ())), cache.state.depth
    if n_blocks == 0 or len(getattr(unet, "input_blocks", ())) != n_blocks:
        return "not a U-Net with matching input/output blocks"
    if depth >= n_blocks:
        return f"cache_depth {depth} >= the model's {n_blocks} blocks"
    if control is not None:
        return "a ControlNet feeds the U-Net"
    if getattr(unet, "predict_codebook_ids", False) or set(kwargs) & {"num_video_frames", "time_context"}:
        return "video/codebook U-Net"
    if opts.get("sample_sigmas") is None or opts.get("sigmas") is None:
        return "no sample_sigmas in transformer_options"
    # sticky for the run: e.g. a ControlNet on the cond only (the uncond has none) or one whose window ends: the log
    # and the summary say the run was full from there
    return cache.state.fallback


def _step_of(cache: _Cache, opts: dict[str, Any]) -> tuple[int, int, float]:
    """(step, steps, sigma) of a model call."""
    state = cache.state
    steps = run_steps(opts, cache.step_key)
    if steps is not None:
        # The sampler's step from the run's host-side step state: no device sync (scheduling/step_state.py).
        state.sample_sigmas = steps.sigmas
        i = min(steps.step, steps.steps - 1)
        return i, steps.steps, steps.sigmas[i]
    if state.sample_sigmas is None:  # once per run (one host sync), not per call
        state.sample_sigmas = [float(s) for s in opts["sample_sigmas"].reshape(-1).tolist()]
    sigma = float(opts["sigmas"].reshape(-1)[0])  # once per model call: a device sync on a GPU
    return step_index(sigma, state.sample_sigmas), max(1, len(state.sample_sigmas) - 1), sigma


def _plan_call(cache: _Cache, unet: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _CallPlan | None:
    """The host side of one U-Net call: None = run it untouched (cache off or standing aside); else full (deep None:
    run it and keep its deep feature) or cached (the deep feature to reuse)."""
    state = cache.state
    state.captured = None
    opts = args[5] if len(args) > 5 else kwargs.get("transformer_options")
    if not isinstance(opts, dict) or opts.get(cache.disabled_key):
        return None
    opts.pop(SHALLOW_KEY, None)
    x = args[0]
    reason = _unsupported(cache, unet, opts, args[4] if len(args) > 4 else kwargs.get("control"), kwargs)
    if reason:
        _stand_aside(cache, reason)
        state.full_calls += 1
        return None
    n_blocks = len(unet.output_blocks)
    step = _step_of(cache, opts)
    key = (tuple(opts.get("uuids", ()) or ()), tuple(opts.get("cond_or_uncond", ()) or ()), tuple(x.shape))
    entry = state.entries.get(key)
    full = _is_full_step(cache, step, x, key, opts.get(cache.plan_key))
    if not full and entry is not None and entry.deep is not None:
        state.cached_calls += 1
        opts[SHALLOW_KEY] = (state.depth, n_blocks)  # the blocks this call runs (the attention telemetry's replay)
        return _CallPlan(key, entry.deep, entry.transformer_index)
    state.full_calls += 1
    state.capture_block = n_blocks - state.depth
    return _CallPlan(key, None, 0)


def _keep_full(cache: _Cache, key: CacheKey, x: torch.Tensor) -> None:
    """After a full call: the deep feature its output patch captured becomes the entry for `key`."""
    state = cache.state
    entry = state.entries.setdefault(key, _Entry())
    entry.deep, entry.transformer_index, state.captured = state.captured, state.captured_index, None
    entry.x = x if state.threshold > 0 else None


@dataclass(frozen=True)
class StepCacheKeys:
    """The transformer_options keys the step cache reads (scheduling/keys.py; passed in by the node layer).

    plan / disabled: the keys of the TOKEN_PLAN and of "TokenFuse off"; step: the key of the run's SamplingSteps, or
    None (see `build_step_cache`)."""

    plan: str
    disabled: str
    step: str | None = None


def build_step_cache(
    interval: int, depth: int, threshold: float, embed: EmbedFn, keys: StepCacheKeys
) -> StepCacheHooks:
    """Hooks for one model clone (see the module docstring).

    embed: ComfyUI's timestep_embedding (passed in so this module never imports ComfyUI); keys: the
    transformer_options keys it reads (`StepCacheKeys`). With keys.step (the run's SamplingSteps) a call's step costs
    no device sync; a multi-evaluation sampler's later evaluations see the next step (ComfyUI calls the callback
    after a step's first evaluation: heun's second evaluation at sigma[i + 1] sees i + 1, as the sigma lookup did).
    Without it (or when absent from a call's options) the step comes from the call's sigma (`step_index`: one host
    read per model call).
    """
    state = StepCacheState(interval=interval, depth=depth, threshold=threshold)
    cache = _Cache(state, embed, keys.plan, keys.disabled, keys.step)

    def step_cache_output_patch(
        h: torch.Tensor, hsp: torch.Tensor, transformer_options: dict[str, Any]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # h enters output block ("output", id): keep the one entering the cache branch. Traceable on purpose (no read
        # of per-step state, so torch.compile neither breaks the graph here nor guards on a value that changes).
        if transformer_options.get("block") == ("output", state.capture_block):
            # a copy, taken before any other output_block_patch (ours runs first): FreeU scales h in place after us
            state.captured = h.clone()
            state.captured_index = int(transformer_options.get("transformer_index", 0) or 0)
        return h, hsp

    # The host logic runs eagerly under torch.compile (ComfyUI's TorchCompileModel compiles the whole U-Net,
    # this wrapper included): one graph break before the call and one after a full call. Traced, dynamo guarded on
    # the per-step state (`decided`, counters) and recompiled every step until its recompile limit.
    plan_call_eager = eager_under_compile(lambda unet, args, kwargs: _plan_call(cache, unet, args, kwargs))
    keep_full_eager = eager_under_compile(lambda key, x: _keep_full(cache, key, x))

    def step_cache_diffusion_model(executor: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # UNetModel.forward's executor: (x, timesteps, context, y, control, transformer_options, **kwargs)
        unet = getattr(executor, "class_obj", None)
        call = plan_call_eager(unet, args, kwargs)
        if call is None:
            return executor(*args, **kwargs)
        if call.deep is not None:
            return shallow_forward(cache, unet, call, args, kwargs)
        out = executor(*args, **kwargs)
        keep_full_eager(call.key, args[0])
        return out

    return StepCacheHooks(state, step_cache_diffusion_model, step_cache_output_patch)
