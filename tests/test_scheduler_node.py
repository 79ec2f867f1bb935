"""TokenSchedulerController without ComfyUI: widgets → Schedule, text override, report, clone-not-mutate (fake MODEL).

The fake ModelPatcher below mirrors the few ModelPatcher methods the node uses (clone deep-copies model_options, as
ComfyUI's does); family detection reads class names, so the fake model classes carry ComfyUI's names.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import sys
from dataclasses import replace
from types import SimpleNamespace
from typing import get_args

import pytest
import torch
from tokenfuse.nodes.glue import env, patcher, ui
from tokenfuse.nodes.glue import paths as comfy_paths
from tokenfuse.nodes.model_patching import chain_attention_override
from tokenfuse.nodes.scheduler_node import TokenSchedulerController, schedule_from_widgets
from tokenfuse.scheduling.plan import TokenPlan
from tokenfuse.scheduling.schedule import ScheduleError, preset_schedule

NODE = TokenSchedulerController()


# ---- stand-ins with ComfyUI's class names (detect_family reads names only) ----
class UNetModel:
    pass


class Flux:  # model_base.Flux
    def __init__(self) -> None:
        self.model_config = None
        self.diffusion_model = object()


class HunyuanDiT:  # model_base.HunyuanDiT: its attention takes no transformer_options
    def __init__(self) -> None:
        self.model_config = None
        self.diffusion_model = object()


class SD15:
    unet_config = {"transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0]}


class SDXL:
    unet_config = {"transformer_depth": [0, 0, 2, 2, 10, 10]}


class BaseModel:
    def __init__(self, config: object) -> None:
        self.model_config = config
        self.diffusion_model = UNetModel()


class FakeModelPatcher:
    def __init__(self, model: object, model_options: dict | None = None) -> None:
        self.model = model
        self.model_options = model_options if model_options is not None else {"transformer_options": {}}
        self.wrappers: dict = {}
        self.load_device = torch.device("cpu")

    def clone(self) -> FakeModelPatcher:
        n = FakeModelPatcher(self.model, copy.deepcopy(self.model_options))
        n.wrappers = {k: {k1: list(w) for k1, w in v.items()} for k, v in self.wrappers.items()}
        return n

    def set_model_patch(self, patch: object, name: str) -> None:
        to = self.model_options["transformer_options"]
        to.setdefault("patches", {})
        to["patches"][name] = to["patches"].get(name, []) + [patch]

    def set_model_attn1_patch(self, patch: object) -> None:
        self.set_model_patch(patch, "attn1_patch")

    def set_model_attn1_output_patch(self, patch: object) -> None:
        self.set_model_patch(patch, "attn1_output_patch")

    def add_wrapper_with_key(self, wrapper_type: str, key: str, fn: object) -> None:
        self.wrappers.setdefault(wrapper_type, {}).setdefault(key, []).append(fn)


def other_attn1(n, ctx, val, extra):  # another pack's attn1 patch (identity)
    return n, ctx, val


def ipadapter_attn2(n, ctx, val, extra):  # stands for IPAdapter's attn2 replacement
    return n


def sd15_model(**options) -> FakeModelPatcher:
    return FakeModelPatcher(BaseModel(SD15()), {"transformer_options": {}, **options})


def snapshot(m: FakeModelPatcher) -> tuple:
    """Everything the node could mutate, with patch callables compared by identity."""
    return repr(m.model_options), {k: {k1: list(map(id, w)) for k1, w in v.items()} for k, v in m.wrappers.items()}


# ---- widgets → Schedule ----
def test_preset_widgets_map_to_preset_schedule() -> None:
    assert schedule_from_widgets("balanced", "preset", 0.0, "sd15") == preset_schedule("balanced", "sd15")
    assert schedule_from_widgets("balanced", "preset", 0.0, "sdxl") == preset_schedule("balanced", "sdxl")
    assert schedule_from_widgets("off", "tome", 0.5, "sd15").is_off  # off stays identity whatever the widgets say


def test_strategy_and_ratio_widgets_override_the_preset() -> None:
    s = schedule_from_widgets("balanced", "tome", 0.5, "sd15")
    assert s.strategy == "tome"
    assert s.ratios == {lv: 0.5 for lv in preset_schedule("balanced", "sd15").ratios}
    dit = schedule_from_widgets("balanced", "todo", 0.3, "dit")
    assert dit.dit_ratio == pytest.approx(0.3) and dit.strategy == preset_schedule("balanced", "dit").strategy


def test_schedule_text_overrides_widgets_json_and_yaml() -> None:
    s = schedule_from_widgets("balanced", "tome", 0.5, "sd15", '{"ratios": {"8": 0.25}, "end_percent": 0.6}')
    assert s.strategy == "tome" and s.ratios == {8: 0.25} and s.end_percent == pytest.approx(0.6)
    y = schedule_from_widgets("balanced", "preset", 0.0, "sd15", "strategy: topk\nprotect_blocks: 3\n")
    assert y.strategy == "topk" and y.protect_blocks == 3


@pytest.mark.parametrize(
    ("text", "field"),
    [('{"end_percent": 2}', "end_percent"), ("ratios: {8: 1.5}", "ratios[8]"), ('{"strenght": 1}', "strenght")],
)
def test_schedule_text_error_names_the_field(text: str, field: str) -> None:
    with pytest.raises(ScheduleError, match=field.replace("[", r"\[").replace("]", r"\]")):
        NODE.apply(sd15_model(), "balanced", "preset", 0.0, schedule_text=text)


# ---- the node on a fake MODEL ----
def test_schedule_text_takes_every_widget_name_as_the_widget_does() -> None:
    """{"ratio": 0.5} was refused ("unknown Schedule field(s) ['ratio']") although the node has a ratio widget: a
    widget named in the text now acts as the widget set to that value, and the fields apply after it."""
    for family in ("sd15", "sdxl", "dit"):
        assert schedule_from_widgets("balanced", "preset", 0.0, family, '{"ratio": 0.5}') == schedule_from_widgets(
            "balanced", "preset", 0.5, family
        )
    assert schedule_from_widgets("off", "preset", 0.0, "sd15", "preset: lowvram_4gb") == preset_schedule("lowvram_4gb")
    assert schedule_from_widgets("balanced", "tome", 0.0, "sd15", '{"strategy": "preset"}').strategy == "todo"
    text = '{"preset": "lowvram_8gb", "strategy": "tome", "ratio": 0.25, "end_percent": 0.5}'
    assert schedule_from_widgets("off", "preset", 0.0, "sd15", text) == replace(
        schedule_from_widgets("lowvram_8gb", "tome", 0.25, "sd15"), end_percent=0.5
    )
    assert schedule_from_widgets("off", "preset", 0.0, "sd15", '{"ratio": 0.5}').is_off  # as the widget: off stays off


def test_the_report_names_the_preset_a_schedule_text_sets() -> None:
    _, report = NODE.apply(sd15_model(), "balanced", "preset", 0.0, schedule_text='{"preset": "lowvram_4gb"}')
    assert "preset lowvram_4gb;" in report and "/64:0.50" in report, report


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"ratio": 0.95}', r"^schedule_text 'ratio' must be a number in \[0.0, 0.9\], got 0.95$"),
        ('{"ratio": true}', r"'ratio' must be a number .*, got True$"),
        ("ratio: .inf", r"'ratio' must be a number .*, got inf$"),
        ('{"preset": "fast"}', r"^schedule_text 'preset' must be one of \('off', 'balanced', .*\), got 'fast'$"),
        (
            '{"ratio": 0.5, "rato": 1}',
            r"unknown Schedule field\(s\) \['rato'\]; allowed: the widgets \['preset', 'ratio', ",
        ),
    ],
)
def test_bad_widget_values_in_schedule_text_are_refused_as_the_widgets_would_be(text: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        schedule_from_widgets("balanced", "preset", 0.0, "sd15", text)


def test_model_is_cloned_not_mutated_and_patches_chain() -> None:
    model = sd15_model()
    model.set_model_attn1_patch(other_attn1)
    model.model_options["transformer_options"]["patches_replace"] = {"attn2": {("input", 1): ipadapter_attn2}}
    before = snapshot(model)
    patched, report = NODE.apply(model, "balanced", "preset", 0.0)
    assert snapshot(model) == before
    assert patched is not model
    patches = patched.model_options["transformer_options"]["patches"]
    assert patches["attn1_patch"][0] is other_attn1 and len(patches["attn1_patch"]) == 2  # theirs first, then ours
    assert len(patches["attn1_output_patch"]) == 1
    assert patched.model_options["transformer_options"]["patches_replace"]["attn2"][("input", 1)] is ipadapter_attn2
    assert list(patched.wrappers["outer_sample"]) == ["tokenfuse"]
    assert "SD15 (sd15, attn1 patches)" in report and "strategy todo" in report and "/8:0.75" in report


def test_sdxl_family_and_token_plan_reach_transformer_options() -> None:
    model = FakeModelPatcher(BaseModel(SDXL()))
    plan = TokenPlan(importance=torch.ones(1, 64, 64), image_size=(64, 64))
    patched, report = NODE.apply(model, "balanced", "preset", 0.0, token_plan=plan)
    assert patched.model_options["transformer_options"]["tokenfuse_plan"] is plan
    assert "tokenfuse_plan" not in model.model_options["transformer_options"]
    assert "(sdxl, attn1 patches)" in report and "/16:0.75" in report and "1 image(s)" in report


def test_off_preset_attaches_no_attention_patch() -> None:
    patched, report = NODE.apply(sd15_model(), "off", "preset", 0.0)
    assert "patches" not in patched.model_options["transformer_options"]
    assert "off (identity)" in report


def test_dit_family_uses_the_attention_override_and_chains_an_existing_one() -> None:
    def theirs(func, *args, **kwargs):
        return func(*args, **kwargs)

    model = FakeModelPatcher(Flux(), {"transformer_options": {"optimized_attention_override": theirs}})
    before = snapshot(model)
    patched, report = NODE.apply(model, "balanced", "preset", 0.0)
    assert snapshot(model) == before
    override = patched.model_options["transformer_options"]["optimized_attention_override"]
    assert callable(override) and override is not theirs
    assert "Flux (dit, attention override)" in report


def test_chain_attention_override_runs_both_in_order() -> None:
    calls: list[str] = []

    def theirs(func, *args, **kwargs):
        calls.append("theirs")
        return func(*args, **kwargs) + 1

    def ours(func, *args, **kwargs):
        calls.append("ours")
        return func(*args, **kwargs) * 10

    chained = chain_attention_override(ours, theirs)
    assert chained(lambda x: x, 2) == 30 and calls == ["ours", "theirs"]
    assert chain_attention_override(ours, None) is ours


def test_unsupported_model_passes_through_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    model = FakeModelPatcher(HunyuanDiT())
    with caplog.at_level(logging.WARNING):
        out, report = NODE.apply(model, "balanced", "preset", 0.0)
    assert out is model and model.model_options == {"transformer_options": {}}
    assert "unchanged" in report
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_non_model_input_raises_a_clear_error() -> None:
    with pytest.raises(TypeError, match="expects a ComfyUI MODEL"):
        NODE.apply(object(), "balanced", "preset", 0.0)


def test_outer_sample_wrapper_resets_and_logs_one_line_even_on_error(caplog: pytest.LogCaptureFixture) -> None:
    patched, _ = NODE.apply(sd15_model(), "balanced", "preset", 0.0)
    (wrapper,) = patched.wrappers["outer_sample"]["tokenfuse"]
    with caplog.at_level(logging.INFO, logger="tokenfuse"):
        assert wrapper(lambda a, b=0: a + b, 1, b=2) == 3
        with pytest.raises(RuntimeError):
            wrapper(lambda: (_ for _ in ()).throw(RuntimeError("cancelled")))
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(lines) == 2 and all("tokens saved" in ln and "peak" in ln for ln in lines)


def test_glue_fallbacks_without_a_server() -> None:
    assert ui.send_stats("tokenfuse.stats", {"calls": 0}) is False
    bar = env.progress_bar(3)
    bar.update(1)
    env.throw_if_interrupted()


def test_schedule_widget_replace_keeps_frozen_dataclass() -> None:
    s = schedule_from_widgets("lowvram_6gb", "preset", 0.0, "sd15")
    assert replace(s, seed=1) != s and s == preset_schedule("lowvram_6gb", "sd15")


def test_attached_patches_reduce_tokens_and_the_run_line_reports_them(caplog: pytest.LogCaptureFixture) -> None:
    """The closures on the fake clone run on real tensors the way a BasicTransformerBlock calls them."""
    patched, _ = NODE.apply(sd15_model(), "balanced", "preset", 0.0)
    patches = patched.model_options["transformer_options"]["patches"]
    (attn1,), (attn1_out,) = patches["attn1_patch"], patches["attn1_output_patch"]
    (wrapper,) = patched.wrappers["outer_sample"]["tokenfuse"]
    n = torch.randn(2, 16 * 16, 32)  # latent 16x16: level /8 tokens, batch 2 (CFG)
    extra = _level8_extra()

    def sample() -> tuple:
        q, k, v = attn1(n, n, n, dict(extra))
        return q, k, v, attn1_out(q, dict(extra))

    with caplog.at_level(logging.INFO, logger="tokenfuse"):
        q, k, v, out = wrapper(sample)
    assert q is n and out is n and k.shape == v.shape == (2, 64, 32)  # 2x2 K/V pooling, queries untouched
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert "1/1 attention calls reduced" in line and "37.5% q+k/v tokens saved" in line


class FakePromptServer:
    """Stands for server.PromptServer.instance: records send_sync calls."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []
        self.client_id = "browser-a"  # the client that queued the running prompt
        self.last_prompt_id = "prompt-1"  # set by ComfyUI's prompt worker before each run
        self.sids: list[str | None] = []

    def send_sync(self, event: str, data: dict, sid: str | None = None) -> None:
        self.events.append((event, data))
        self.sids.append(sid)


def test_live_stats_follow_the_web_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    server = FakePromptServer()
    monkeypatch.setitem(sys.modules, "server", SimpleNamespace(PromptServer=SimpleNamespace(instance=server)))
    patched, _ = NODE.apply(sd15_model(), "balanced", "preset", 0.0, unique_id="12")
    (attn1,) = patched.model_options["transformer_options"]["patches"]["attn1_patch"]
    (run,) = patched.wrappers["outer_sample"]["tokenfuse"]
    (step,) = patched.wrappers["predict_noise"]["tokenfuse"]
    sample_sigmas = torch.tensor([14.6, 7.0, 1.0, 0.0])
    extra = {
        "original_shape": [2, 4, 16, 16],
        "transformer_index": 0,
        "block": ("input", 1),
        "sample_sigmas": sample_sigmas,
    }
    n = torch.randn(2, 256, 32)

    def predict_noise(x, timestep, model_options=None, seed=None):
        attn1(n, n, n, {**extra, "sigmas": timestep})
        return x

    def sampling() -> None:
        for sigma in sample_sigmas[:-1]:
            step(predict_noise, n, sigma.reshape(1), {"transformer_options": {"sample_sigmas": sample_sigmas}})

    run(sampling)
    payloads = [data for event, data in server.events if event == "tokenfuse.stats"]
    assert [p["step"] for p in payloads] == [1, 2, 3, 3] and all(p["steps"] == 3 for p in payloads)
    assert all(p["node"] == "12" for p in payloads) and [p["final"] for p in payloads] == [False] * 3 + [True]
    # the workflow tab that queued this prompt shows them (one page's tabs share the client id)
    assert all(p["prompt_id"] == "prompt-1" for p in payloads)
    assert payloads[0]["levels"] == [{"level": 8, "tokens_in": 256, "tokens_out": 64}]
    assert payloads[0]["step_time_s"] >= 0
    # CPU: the process peak RSS, as the run summary says (the chart showed "peak —" for the whole run)
    assert payloads[0]["peak_mem_kind"] == "rss" and payloads[0]["peak_mem_mb"] > 10
    summary_mib = float(re.search(r"peak RSS (\d+) MiB", payloads[-1]["summary"])[1])
    assert abs(payloads[-1]["peak_mem_mb"] - summary_mib) <= 1
    assert "tokens saved" in payloads[-1]["summary"] and payloads[-1]["levels"] == []
    # only to the browser that queued the prompt: another one's idle node with the same id showed this run's stats
    assert set(server.sids) == {"browser-a"}
    assert [p["status"] for p in payloads] == [None] * 3 + ["complete"]

    interrupt = type("InterruptProcessingException", (Exception,), {})  # ComfyUI's cancel, matched by name

    def cancelled() -> None:
        step(predict_noise, n, sample_sigmas[0].reshape(1), {"transformer_options": {"sample_sigmas": sample_sigmas}})
        raise interrupt()

    server.events.clear()
    with pytest.raises(interrupt):
        run(cancelled)
    final = [data for event, data in server.events if event == "tokenfuse.stats"][-1]
    assert final["final"] and final["status"] == "cancelled" and final["step"] == 1, final


def test_family_detection_by_comfyui_class_names() -> None:
    class VideoUNet(UNetModel):  # SVD's U-Net subclasses UNetModel
        pass

    class SVD_img2vid:
        unet_config = {"transformer_depth": [1, 1, 1, 1, 1, 1, 0, 0]}

    class WAN22(Flux):  # any subclass of a supported model_base class counts (stands for WAN22(WAN21))
        pass

    svd = BaseModel(SVD_img2vid())
    svd.diffusion_model = VideoUNet()
    assert patcher.detect_family(FakeModelPatcher(svd)) == patcher.ModelFamily("sd15", "unet", "SVD_img2vid")
    assert patcher.detect_family(FakeModelPatcher(BaseModel(SDXL()))).family == "sdxl"
    assert patcher.detect_family(FakeModelPatcher(WAN22())).route == "override"
    assert patcher.detect_family(FakeModelPatcher(HunyuanDiT())).route == "none"
    sd3 = type("SD3", (), {"model_config": None, "diffusion_model": object()})()  # 0.3.64 MMDiT: the override
    assert patcher.detect_family(FakeModelPatcher(sd3)) == patcher.ModelFamily("dit", "override", "SD3")
    assert patcher.detect_family(object()).route == "none"


def test_strategy_choices_follow_the_core_literal() -> None:
    from tokenfuse.nodes.scheduler_node import STRATEGY_CHOICES, TokenSchedulerController
    from tokenfuse.scheduling.schedule import Strategy

    assert STRATEGY_CHOICES == ("preset", *get_args(Strategy))
    assert TokenSchedulerController.INPUT_TYPES()["required"]["strategy"][0] == list(STRATEGY_CHOICES)


def test_scheduling_twice_replaces_the_first_and_keeps_other_patches() -> None:
    model = sd15_model()
    model.set_model_attn1_patch(other_attn1)
    first, _ = NODE.apply(model, "balanced", "preset", 0.0)
    second, report = NODE.apply(first, "lowvram_8gb", "preset", 0.0)
    patches = second.model_options["transformer_options"]["patches"]
    assert patches["attn1_patch"][0] is other_attn1 and len(patches["attn1_patch"]) == 2
    assert len(patches["attn1_output_patch"]) == 1
    assert len(second.wrappers["outer_sample"]["tokenfuse"]) == 1
    assert len(second.wrappers["predict_noise"]["tokenfuse"]) == 1
    assert len(first.model_options["transformer_options"]["patches"]["attn1_patch"]) == 2  # first clone untouched

    def theirs(func, *args, **kwargs):
        return func(*args, **kwargs)

    flux = FakeModelPatcher(Flux(), {"transformer_options": {"optimized_attention_override": theirs}})
    twice, _ = NODE.apply(NODE.apply(flux, "balanced", "preset", 0.0)[0], "off", "preset", 0.0)
    assert twice.model_options["transformer_options"]["optimized_attention_override"] is theirs


def test_rescheduling_a_dit_model_replaces_our_own_override() -> None:
    """With no other pack's override, ours was not recognised as ours on a second TokenSchedulerController: `off`
    after `balanced` kept the old override (not identity), a second `balanced` stacked on the first."""
    once, _ = NODE.apply(FakeModelPatcher(Flux()), "balanced", "preset", 0.0)
    ours = once.model_options["transformer_options"]["optimized_attention_override"]
    off, _ = NODE.apply(once, "off", "preset", 0.0)
    assert "optimized_attention_override" not in off.model_options["transformer_options"]
    again, _ = NODE.apply(once, "balanced", "preset", 0.0)
    override = again.model_options["transformer_options"]["optimized_attention_override"]
    assert override is not ours and getattr(override, "tokenfuse_previous", None) is None


def test_rescheduling_drops_the_earlier_plan_and_preset() -> None:
    """The second node's schedule replaces the first's whole: a TOKEN_PLAN and preset it does not set are gone (a
    stale plan changed the sample; a stale preset made ScheduledFusion's OOM fallback step up from the wrong one)."""
    from tokenfuse.scheduling.plan import TokenPlan

    plan = TokenPlan(importance=torch.ones(1, 8, 8), image_size=(64, 64))
    first, _ = NODE.apply(sd15_model(), "balanced", "preset", 0.0, token_plan=plan)
    assert first.model_options["transformer_options"]["tokenfuse_plan"] is plan
    second, _ = NODE.apply(first, "lowvram_4gb", "preset", 0.0, schedule_text='{"ratios": {"8": 0.5}}')
    to = second.model_options["transformer_options"]
    assert "tokenfuse_plan" not in to and "tokenfuse_preset" not in to
    assert first.model_options["transformer_options"]["tokenfuse_preset"] == "balanced"  # the first clone untouched


def test_cuda_peak_never_resets_the_allocator_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """ScheduledFusion and the benches measure their own spans with max_memory_allocated: the run line must not reset
    it, and still reports this run's peak when the run set a new one."""
    from tokenfuse.nodes.peak_memory import peak_memory_start

    peaks = iter([1024 * 2**20, 3072 * 2**20, 3072 * 2**20])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda dev=None: next(peaks))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda dev=None: pytest.fail("peak was reset"))
    text, mib = peak_memory_start("cuda")
    assert text() == "peak VRAM 3072 MiB" and mib() == 3072


def test_preset_is_recorded_for_the_fusion_fallback_and_text_override_clears_it() -> None:
    patched, _ = TokenSchedulerController().apply(sd15_model(), "lowvram_8gb", "preset", 0.0)
    assert patched.model_options["transformer_options"]["tokenfuse_preset"] == "lowvram_8gb"
    custom, _ = TokenSchedulerController().apply(
        sd15_model(), "lowvram_8gb", "preset", 0.0, schedule_text='{"ratios": {"8": 0.5}}'
    )
    assert "tokenfuse_preset" not in custom.model_options["transformer_options"]


# ---- telemetry file: only a bare name, only inside the output folder (a prompt must not write elsewhere) ----
@pytest.mark.parametrize(
    "name",
    ["/tmp/x.jsonl", "../x.jsonl", "a/b.jsonl", "a\\b.jsonl", "..jsonl", "x.txt", ".x.jsonl", "x" * 200 + ".jsonl"],
)
def test_telemetry_path_from_a_prompt_is_refused_before_anything_runs(name: str) -> None:
    with pytest.raises(ScheduleError, match="bare file name"):
        NODE.apply(sd15_model(), "balanced", "preset", 0.0, schedule_text=json.dumps({"telemetry_jsonl": name}))


def test_telemetry_lands_in_the_output_folder_only(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv(comfy_paths.OUTPUT_DIR_ENV, str(out / "tokenfuse"))
    patched, _ = NODE.apply(sd15_model(), "balanced", "preset", 0.0, schedule_text='{"telemetry_jsonl": "run.jsonl"}')
    (wrapper,) = patched.wrappers["outer_sample"]["tokenfuse"]
    wrapper(lambda: None)
    written = out / "tokenfuse" / "run.jsonl"
    assert json.loads(written.read_text().splitlines()[-1])["summary"]["calls"] == 0
    # a symlink planted at the name is never followed: the file it points to keeps its bytes
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    written.unlink()
    written.symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="tokenfuse"):
        wrapper(lambda: None)
    assert victim.read_text() == "keep me"
    assert any("telemetry not written" in r.getMessage() for r in caplog.records)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "victim.txt"]


def test_output_folder_parent_is_never_created(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(comfy_paths.OUTPUT_DIR_ENV, str(tmp_path / "missing" / "tokenfuse"))
    with pytest.raises(comfy_paths.OutputPathError, match="no parent folder"):
        comfy_paths.output_file("run.jsonl")
    assert not (tmp_path / "missing").exists()
    monkeypatch.setenv(comfy_paths.OUTPUT_DIR_ENV, str(tmp_path))
    for bad in ("../x.jsonl", "a/b.jsonl", "..", ""):
        with pytest.raises(comfy_paths.OutputPathError):
            comfy_paths.output_file(bad)
    for device in ("NUL.jsonl", "con.jsonl", "com1.run.jsonl"):  # the null device / console on Windows
        with pytest.raises(comfy_paths.OutputPathError, match="device name on Windows"):
            comfy_paths.output_file(device)
    assert comfy_paths.output_file("console.jsonl").name == "console.jsonl"


def test_the_report_never_claims_protected_blocks_on_a_dit_model() -> None:
    """ComfyUI's DiT models give attention no block index: protect_blocks cannot act there, and the report said
    "first 2 blocks kept" for the DiT balanced preset while every call was reduced."""
    from tokenfuse.nodes.scheduler_node import describe_schedule
    from tokenfuse.scheduling.schedule import Schedule, preset_schedule

    _, report = NODE.apply(FakeModelPatcher(Flux()), "balanced", "preset", 0.0)
    assert "blocks kept" not in report and preset_schedule("balanced", "dit").protect_blocks == 0
    text = describe_schedule(Schedule(strategy="topk", dit_ratio=0.5, protect_blocks=2), "override")
    assert "protect_blocks ignored (U-Nets only" in text
    assert "first 2 blocks kept" in describe_schedule(Schedule(ratios={8: 0.5}, protect_blocks=2), "unet")


class InterruptProcessingException(Exception):  # comfy.model_management's cancel, matched by class name
    pass


def test_a_cancelled_or_failed_run_says_so_and_never_replaces_the_complete_telemetry(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Cancelling at step 3 of 6 replaced the complete file with a partial one whose summary record and INFO line read
    like a finished run. Now: the line and record say cancelled/failed, the complete file stays, the partial run goes
    to <name>.partial, and no temporary file is left behind."""
    monkeypatch.setenv(comfy_paths.OUTPUT_DIR_ENV, str(tmp_path))
    patched, _ = NODE.apply(sd15_model(), "balanced", "preset", 0.0, schedule_text='{"telemetry_jsonl": "run.jsonl"}')
    (wrapper,) = patched.wrappers["outer_sample"]["tokenfuse"]
    steps = _attn1_steps(patched)
    with caplog.at_level(logging.INFO, logger="tokenfuse"):
        assert wrapper(steps, 3) == "done"
    complete = (tmp_path / "run.jsonl").read_text()
    assert json.loads(complete.splitlines()[-1])["summary"]["status"] == "complete"
    assert not [r for r in caplog.records if "run (partial)" in r.getMessage()]
    for exc, status in ((InterruptProcessingException(), "cancelled"), (RuntimeError("boom"), "failed")):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="tokenfuse"), pytest.raises(type(exc)):
            wrapper(steps, 1, exc)
        assert (tmp_path / "run.jsonl").read_text() == complete, "the complete run's file was replaced"
        rows = [json.loads(x) for x in (tmp_path / "run.jsonl.partial").read_text().splitlines()]
        assert rows[-1]["summary"]["status"] == status and rows[-1]["summary"]["calls"] == 1
        (line,) = [r.getMessage() for r in caplog.records if "tokens saved" in r.getMessage()]
        assert line.startswith(f"TokenFuse: {status} run (partial): ")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl", "run.jsonl.partial"]


def _level8_extra() -> dict:
    """extra_options of an attention call at level /8 (latent 16x16, batch 2) at the first of 3 steps."""
    return {
        "original_shape": [2, 4, 16, 16],
        "transformer_index": 0,
        "block": ("input", 1),
        "block_index": 0,
        "sigmas": torch.tensor([14.6]),
        "sample_sigmas": torch.tensor([14.6, 7.0, 1.0, 0.0]),
    }


def _attn1_steps(patched: FakeModelPatcher):
    """steps(k, then=None): k attention calls through the patched clone's attn1 patch, then raise `then` if given."""
    (attn1,) = patched.model_options["transformer_options"]["patches"]["attn1_patch"]
    n = torch.randn(2, 16 * 16, 32)
    extra = _level8_extra()

    def steps(k: int, then: BaseException | None = None) -> str:
        for _ in range(k):
            attn1(n, n, n, dict(extra))
        if then is not None:
            raise then
        return "done"

    return steps


def test_a_sampling_series_logs_one_info_line_and_one_telemetry_file_for_all_its_runs(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """VideoFaceFusion samples once per key-frame batch: each run logged its INFO line (~300 for a 5-minute clip) and
    rewrote the telemetry file, which kept the last batch only. Inside sampling_series the runs log at DEBUG, the
    series logs one INFO line summing them, and the file holds every run with one summary at the end."""
    from tokenfuse.nodes.model_patching import in_sampling_series, sampling_series

    monkeypatch.setenv(comfy_paths.OUTPUT_DIR_ENV, str(tmp_path))
    patched, _ = NODE.apply(sd15_model(), "balanced", "preset", 0.0, schedule_text='{"telemetry_jsonl": "run.jsonl"}')
    (wrapper,) = patched.wrappers["outer_sample"]["tokenfuse"]
    steps = _attn1_steps(patched)
    with caplog.at_level(logging.DEBUG, logger="tokenfuse"):
        with sampling_series("VideoFaceFusion"):
            assert in_sampling_series()
            for k in (1, 2, 3):
                wrapper(steps, k)
        assert not in_sampling_series()
    runs = [r for r in caplog.records if "tokens saved" in r.getMessage()]
    assert [r.levelno for r in runs] == [logging.DEBUG] * 3 + [logging.INFO]
    line = runs[-1].getMessage()
    assert line.startswith("TokenFuse: 3 sampling runs, ") and "6/6 attention calls reduced" in line
    assert "[VideoFaceFusion: SD15 (sd15)]" in line
    rows = [json.loads(x) for x in (tmp_path / "run.jsonl").read_text().splitlines()]
    assert [r["run"] for r in rows if "run_summary" in r] == [1, 2, 3]
    assert [r["run"] for r in rows if "block" in r] == [1, 2, 2, 3, 3, 3]
    summary = rows[-1]["summary"]
    assert summary["status"] == "complete" and summary["runs"] == 3 and summary["calls"] == 6
    assert [r for r in rows if "summary" in r] == [rows[-1]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.jsonl"]
    # a series that raises (the user's cancel): the complete file stays, the partial series goes next to it, the
    # context is reset, and a run after it is a run of its own again (INFO)
    complete = (tmp_path / "run.jsonl").read_text()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tokenfuse"), pytest.raises(InterruptProcessingException):
        with sampling_series("VideoFaceFusion"):
            wrapper(steps, 2)
            raise InterruptProcessingException()
    (line,) = [r.getMessage() for r in caplog.records if "tokens saved" in r.getMessage()]
    assert line.startswith("TokenFuse: cancelled (partial): 1 sampling run, ")
    assert (tmp_path / "run.jsonl").read_text() == complete
    partial = [json.loads(x) for x in (tmp_path / "run.jsonl.partial").read_text().splitlines()]
    assert partial[-1]["summary"]["status"] == "cancelled" and partial[-1]["summary"]["runs"] == 1
    assert not in_sampling_series()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tokenfuse"):
        wrapper(steps, 1)
    assert [r.levelno for r in caplog.records if "tokens saved" in r.getMessage()] == [logging.INFO]


def test_the_step_cache_on_a_dit_model_is_reported_ignored_once(caplog: pytest.LogCaptureFixture) -> None:
    """The step cache is attached to U-Nets only: on Flux the report said "step cache every 2 steps" and the run line
    said nothing, while every step ran in full. It must say, once, that the cache is ignored."""
    model = FakeModelPatcher(Flux())
    for preset in ("balanced", "off"):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            patched, report = NODE.apply(model, preset, "preset", 0.0, schedule_text='{"cache_interval": 2}')
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "cache_interval is ignored" in warned[0] and "Flux" in warned[0], warned
        assert "step cache ignored (U-Nets only" in report and "step cache every" not in report, report
        assert "output_block_patch" not in patched.model_options["transformer_options"].get("patches", {})
    from tokenfuse.nodes.scheduler_node import describe_schedule
    from tokenfuse.scheduling.schedule import Schedule

    assert "step cache every 2 steps" in describe_schedule(Schedule(cache_interval=2), "unet")


class WAN21:  # model_base.WAN21: attention over the video tokens alone
    def __init__(self) -> None:
        self.model_config = None
        self.diffusion_model = object()


def test_a_token_plan_on_a_dit_model_is_mapped_on_flux_and_reported_unused_elsewhere() -> None:
    """The report said "expected N% tokens saved" for a TOKEN_PLAN on any DiT while the override never read it. Flux
    (patch size 2) gets the wrapper that maps it onto its joint sequence; another DiT's report says it is unused (its
    override warns once when a plan reaches it: tests/test_patches.py)."""
    plan = TokenPlan(importance=torch.ones(1, 64, 64), image_size=(64, 64))
    flux = Flux()
    flux.diffusion_model = SimpleNamespace(patch_size=2)
    patched, report = NODE.apply(FakeModelPatcher(flux), "balanced", "preset", 0.0, token_plan=plan)
    names = [getattr(w, "__name__", "") for ws in patched.wrappers.values() for w in ws.get("tokenfuse", [])]
    assert "tokenfuse_dit_plan" in names and "tokens saved" in report
    patched, report = NODE.apply(FakeModelPatcher(WAN21()), "balanced", "preset", 0.0, token_plan=plan)
    names = [getattr(w, "__name__", "") for ws in patched.wrappers.values() for w in ws.get("tokenfuse", [])]
    assert "tokenfuse_dit_plan" not in names and "token plan: not used on WAN21" in report, report


def test_the_chart_reads_done_once_per_video_not_between_key_frame_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """VideoFaceFusion samples once per key-frame batch inside sampling_series: each batch's last event was final, so
    the editor's chart read "done" between batches while the video went on. Now the batches' events stay live and the
    series sends one final event with its summary when the video ends."""
    from tokenfuse.nodes.model_patching import sampling_series

    server = FakePromptServer()
    monkeypatch.setitem(sys.modules, "server", SimpleNamespace(PromptServer=SimpleNamespace(instance=server)))
    patched, _ = NODE.apply(sd15_model(), "balanced", "preset", 0.0, unique_id="7")
    (run,) = patched.wrappers["outer_sample"]["tokenfuse"]
    (step,) = patched.wrappers["predict_noise"]["tokenfuse"]
    sigmas = torch.tensor([14.6, 7.0, 0.0])
    n = torch.randn(2, 256, 32)

    def sampling() -> None:
        for sigma in sigmas[:-1]:
            step(lambda x, *a, **k: x, n, sigma.reshape(1), {"transformer_options": {"sample_sigmas": sigmas}})

    with sampling_series("VideoFaceFusion"):
        for _ in range(3):
            run(sampling)
        during = [data for event, data in server.events if event == "tokenfuse.stats"]
        assert during and not any(p["final"] for p in during)
    payloads = [data for event, data in server.events if event == "tokenfuse.stats"]
    assert [p["final"] for p in payloads].count(True) == 1 and payloads[-1]["final"]
    assert payloads[-1]["status"] == "complete" and "3 sampling runs" in payloads[-1]["summary"]
