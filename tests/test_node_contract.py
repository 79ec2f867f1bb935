"""Every node honours ComfyUI's classic node API, with tooltips everywhere (checked without ComfyUI)."""

from __future__ import annotations

import pytest
import tokenfuse

MAPPINGS = tokenfuse.NODE_CLASS_MAPPINGS

EXPECTED_IDS = {  # grows as nodes land; ids never change once released
    "TokenFuseTokenSchedulerController",
    "TokenFuseFaceDetect",
    "TokenFusePatchTokenize",
    "TokenFuseBlend",
    "TokenFuseGFPGANEnhance",
    "TokenFuseScheduledFusion",
}


def _inputs(cls: type) -> list[tuple[str, str, object]]:
    spec = cls.INPUT_TYPES()
    assert set(spec) <= {"required", "optional", "hidden"}, spec.keys()
    out = []
    for section in ("required", "optional"):
        for name, entry in spec.get(section, {}).items():
            out.append((section, name, entry))
    return out


def test_expected_nodes_are_registered() -> None:
    assert EXPECTED_IDS <= set(MAPPINGS)
    assert set(MAPPINGS) == set(tokenfuse.NODE_DISPLAY_NAME_MAPPINGS)


@pytest.mark.parametrize("node_id", sorted(MAPPINGS))
def test_node_contract(node_id: str) -> None:
    cls = MAPPINGS[node_id]
    assert node_id.startswith("TokenFuse"), node_id
    assert tokenfuse.NODE_DISPLAY_NAME_MAPPINGS[node_id]
    assert isinstance(cls.DESCRIPTION, str) and len(cls.DESCRIPTION) > 20
    assert cls.CATEGORY.startswith("TokenFuse")
    assert callable(getattr(cls, cls.FUNCTION))
    assert len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES) == len(cls.OUTPUT_TOOLTIPS)
    assert all(isinstance(t, str) and t for t in cls.OUTPUT_TOOLTIPS)
    for _section, name, entry in _inputs(cls):
        assert isinstance(entry, tuple) and 1 <= len(entry) <= 2, (name, entry)
        opts = entry[1] if len(entry) == 2 else {}
        assert opts.get("tooltip"), f"{node_id}.{name} has no tooltip"
        kind = entry[0]
        if isinstance(kind, list):
            assert opts.get("default", kind[0]) in kind, f"{node_id}.{name}: default not among choices"
        elif kind in ("INT", "FLOAT"):
            lo, hi = opts.get("min"), opts.get("max")
            assert lo is not None and hi is not None and lo <= opts["default"] <= hi, f"{node_id}.{name} range"
