import pytest

from graft.atomic import atomic_dir, write_json


def test_failed_block_leaves_the_old_output(tmp_path):
    out = tmp_path / "model"
    with atomic_dir(out) as tmp:
        (tmp / "w").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "w").write_text("half")
            raise RuntimeError("killed")
    assert (out / "w").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_json_is_stable(tmp_path):
    write_json(tmp_path / "a.json", {"b": 1, "a": 2})
    assert (tmp_path / "a.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
