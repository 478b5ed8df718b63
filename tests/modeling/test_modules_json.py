"""Issue #15 item 7: the module paths in a model folder's ``modules.json`` stay inside the folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.mark.parametrize("bad", ["../outside", "/etc", "a/../../outside", "1_Pooling/../../x"])
def test_module_paths_outside_the_model_folder_are_refused(tiny_model_dir: Path, tmp_path: Path, bad: str):
    from embforge.cross_encoder import CrossEncoder
    from embforge.encoder import Encoder

    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    modules_file = tiny_model_dir / "modules.json"
    modules = json.loads(modules_file.read_text())
    pooling = next(m for m in modules if m["type"].endswith("Pooling"))
    pooling["path"] = bad
    modules_file.write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"modules\.json.*outside the model folder"):
        Encoder.load(tiny_model_dir)
    transformer = next(m for m in modules if m["type"].endswith("Transformer"))
    pooling["path"], transformer["path"] = "1_Pooling", bad
    modules_file.write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=r"modules\.json.*outside the model folder"):
        CrossEncoder.load(tiny_model_dir)


def test_a_link_inside_the_folder_is_fine(tiny_model_dir: Path):
    from embforge.encoder import Encoder

    modules_file = tiny_model_dir / "modules.json"
    modules = json.loads(modules_file.read_text())
    next(m for m in modules if m["type"].endswith("Pooling"))["path"] = "./1_Pooling/"
    modules_file.write_text(json.dumps(modules))
    assert Encoder.load(tiny_model_dir).dim == 32
