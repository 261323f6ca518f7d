"""params.yaml schema: every section, typed and range-checked. ``load_params`` validates the whole file, so a typo
anywhere fails every stage at once, in a second, with one line naming the key."""
from __future__ import annotations

import re
from pathlib import Path

from graft.params import (BOOL, DEVICES, DTYPE, INT, NONNEG_INT, NUM, POS_INT, POS_NUM, SEED, STR, Field, ParamsError,
                          Section, nonneg, positive, read_yaml, unit_open, validate_sections)
from graft.registry import ANSWER_SYNTAX, FISHER_MASKS, FORMATS, GRADERS, PERPLEXITY, PREDICTORS, SOURCES, SUITE_KINDS, SWEPT_MASKS, SWITCHES, suite_schema
from graft.schema_world import WORLD_SCHEMA, check_world
from graft.tables import MESSAGES, mappable_columns

# where the facts stage writes the invented facts: the default knowledge.facts.path
INVENTED_FACTS = "data/facts/invented.parquet"

# a table input (graft.inputs): a Parquet/JSONL/JSON/CSV file or a datasets save_to_disk folder, with a split, a
# mapping of our column names to the data set's, and the marker after which its answer column holds the final answer
TABLE = {
    "path": Field(STR, lambda s: s != "", "a non-empty path"),
    "split": Field(STR, default=""),
    "columns": Field(dict, lambda d: all(d.values()), "a mapping of our column -> a non-empty column name",
                     item=Field(STR), default={}),
    "answer_marker": Field(STR, default=""),
}
SUITE = {
    **TABLE,
    # how it is scored: answers graded (math, fact, contains), or plain text by its likelihood (perplexity)
    "grader": Field(STR, lambda s: s in SUITE_KINDS, f"one of {', '.join(SUITE_KINDS)}", default="math"),
    # the suite's own answer format and instruction; "" takes the answer section's
    "format": Field(STR, lambda s: s == "" or s in FORMATS, f"\"\" or one of {', '.join(FORMATS)}", default=""),
    "instruction": Field(STR, default=""),
}
# a user's off-policy traces: question/think/answer columns, or a chat `messages` column
TRACES = {**TABLE, "drop_context": Field(BOOL, default=False)}
NONEMPTY = Field(STR, lambda s: s != "", "non-empty")
# a file of a pinned pip package: a relative path inside it, so the version pin is what decides its bytes (a path
# out of the package would be an input DVC does not track)
PACKAGE_FILE = Field(STR, lambda s: bool(s) and not Path(s).is_absolute() and ".." not in Path(s).parts,
                     "a relative path inside the package (no leading /, no ..)")
# a real model family derived by the pipeline (stages.import_gguf, stages.posttrain); empty for the embedded world

FAMILY = {
    # name -> a GGUF file shipped in an installed pip package (at this exact version) -> models/family/<name>
    "imports": Field(dict, default={}, item={
        "package": NONEMPTY, "version": NONEMPTY,
        "file": PACKAGE_FILE,   # inside the package; with `parts`, the whole GGUF's file name
        # a GGUF shipped in pieces, each a file in its own package (pinned like the package), joined in this order
        "parts": Field(list, item={"package": NONEMPTY, "version": NONEMPTY, "file": PACKAGE_FILE}, default=[]),
        "sha256": Field(STR, lambda s: s == "" or re.fullmatch(r"[0-9a-f]{64}", s) is not None,
                        "\"\" or 64 lowercase hex digits (the GGUF's SHA-256)", default=""),
        # a Jinja chat template for a model whose tokenizer has none (a pretrained-only base); "" for the model's own
        "chat_template": Field(STR, default=""),
    }),
    # name -> a narrow post-training run of `model` on `data` (question/think/answer traces) ->
    # models/family/<name>/epoch<e>: its own optimiser settings, so the finetune recipe never moves the post model
    "posttrain": Field(dict, default={}, item={
        "model": NONEMPTY,
        "data": TABLE,
        "lr": POS_NUM,
        "epochs": POS_INT,
        "global_batch_size": POS_INT,
        "micro_batch_size": POS_INT,
        "max_len": POS_INT,
        "warmup_ratio": Field(NUM, unit_open, "in [0, 1)", default=0.1),
        "weight_decay": Field(NUM, nonneg, ">= 0", default=0.0),
        "betas": Field(list, lambda b: len(b) == 2 and all(0 <= x < 1 for x in b), "two values in [0, 1)",
                       item=Field(NUM), default=[0.9, 0.95]),
        "grad_clip": Field(NUM, positive, "> 0", default=1.0),
        "dtype": Field(STR, lambda s: s == "float32", "float32 (the snapshots' deltas need it)", default="float32"),
        "checkpoint_every": Field(INT, nonneg, ">= 0", default=20),
        "seed": Field(INT, SEED.check, SEED.rule, default=0),
    }),
}

SCHEMA: dict[str, dict] = {
    "chat": {
        "thinking": Field(BOOL),
        # how thinking is switched off: template (it takes enable_thinking) | prefill (an empty think block after
        # the generation prompt) | none
        "thinking_switch": Field(STR, lambda s: s in SWITCHES, f"one of {', '.join(SWITCHES)}"),
        # [open, close] of the think block, or [] for a model that writes none
        "think_markers": Field(list, lambda v: len(v) in (0, 2) and all(v), "[open, close] (non-empty) or []",
                               item=Field(STR)),
        "system_prompt": Field(STR),            # "" keeps the template's own default system turn
    },
    "models": {
        "pretrain_checkpoints": Field(list, item=Field(STR)),
        "base": Field(STR),
        "post": Field(STR),
        "aligner": Field(STR),
        "trust_remote_code": Field(BOOL),
    },
    "data": {
        "old_suites": Field(dict, item=SUITE),   # name -> table input (``problems`` schema) and how to grade it
        "hard_pool": TABLE,                      # ``hard_pool`` schema
        "retention": TABLE,                      # ``problems`` schema
        "offpolicy": Field(dict, item=TRACES),   # name -> your traces; finetune.source: <name> trains on them
    },
    **WORLD_SCHEMA,
    "family": FAMILY,
    # how the model writes its final answer, and the instruction appended to every question asking for it (old
    # suites may set their own in data.old_suites)
    "answer": {
        "format": Field(STR, lambda s: s in FORMATS, f"one of {', '.join(FORMATS)}"),
        "instruction": Field(STR),
    },
    # where every torch stage runs (finetuning, OPSD, Fisher, KFAC, likelihoods, HF generation); vLLM picks its own
    "compute": {"device": Field(STR, lambda s: s in DEVICES, f"one of {', '.join(DEVICES)}"),
                # torch's CPU threads in each of these stages' processes; 0: torch's default, one per core
                # (graft.openmp.use_threads says why this is a param)
                "threads": NONNEG_INT},
    "generation": {
        "backend": Field(STR, lambda s: s in ("vllm", "hf"), "one of vllm, hf"),
        "dtype": DTYPE,
        "top_p": Field(NUM, lambda x: 0 < x <= 1, "in (0, 1]"),
        "batch_size": POS_INT,
        "max_model_len": POS_INT,
        "vllm_memory_fraction": Field(NUM, lambda x: 0 < x <= 1, "in (0, 1]"),
        "vllm_enforce_eager": Field(BOOL),
        "vllm_tensor_parallel_size": POS_INT,   # vLLM tensor parallelism: the model split over this many devices
        "data_parallel_size": POS_INT,   # engine replicas (torchrun processes) sharing the evaluation's points
    },
    "mine": {
        "k": POS_INT,
        "temperature": POS_NUM,
        "max_successes": NONNEG_INT,
        "heldout": POS_INT,
        "max_new_tokens": POS_INT,
        "seed": SEED,
    },
    "star": {
        "attempts": POS_INT,                    # samples per mined training problem; the first verified one is kept
        "temperature": POS_NUM,
        "max_new_tokens": POS_INT,
        "seed": SEED,
    },
    "synthself": {
        # candidate aligners, name -> model dir; SynthSelf Eq. 6 chooses one ("student" is the post model itself)
        "aligners": Field(dict, lambda d: len(d) > 0 and "student" not in d,
                          'a non-empty mapping of name -> model dir, without the name "student"', item=Field(STR)),
        "max_new_tokens": POS_INT,
    },
    "knowledge": {
        "facts": TABLE,                         # ``facts`` schema: one row per phrasing, in held-out order
        "invent": {                             # the facts stage's invented facts (knowledge.facts: INVENTED_FACTS)
            "entities": POS_INT,
            "relations_per_entity": Field(INT, lambda x: 1 <= x <= 5, "in [1, 5]"),
            "phrasings": Field(INT, lambda x: 2 <= x <= 8, "in [2, 8]"),
        },
        "heldout_phrasings": POS_INT,           # the last phrasings of each fact: evaluation only
        "eval_facts": POS_INT,                  # facts whose held-out phrasings form the new task
        # the training mix replays the teacher traces (the paper's replay); false: the QA pairs alone (a chain step
        # whose hard pool is an earlier step's skill would otherwise rehearse that skill)
        "replay": Field(BOOL, default=True),
        "seed": SEED,
    },
    "finetune": {
        "donor": Field(STR),
        "source": Field(STR),                   # one of SOURCES or a key of data.offpolicy (check_cross)
        "lrs": Field(list, lambda v: len(v) > 0, "non-empty", item=POS_NUM),  # the grid: one finetune each
        "epochs": POS_INT,                      # a snapshot after every epoch
        "global_batch_size": POS_INT,           # examples per optimiser step over all processes
        "micro_batch_size": POS_INT,            # examples per forward pass (gradient accumulation makes up the rest)
        "max_len": POS_INT,
        "loss": Field(STR, lambda s: s in ("sft", "dft"), "one of sft, dft"),
        "warmup_ratio": Field(NUM, unit_open, "in [0, 1)"),
        "weight_decay": Field(NUM, nonneg, ">= 0"),
        "betas": Field(list, lambda b: len(b) == 2 and all(0 <= x < 1 for x in b), "two values in [0, 1)",
                       item=Field(NUM)),
        "grad_clip": POS_NUM,
        "dtype": DTYPE,                         # weights, optimiser and snapshots (keep float32: deltas are small)
        "autocast": Field(STR, lambda s: s in ("none", "bfloat16", "float16"), "one of none, bfloat16, float16"),
        "num_processes": POS_INT,               # > 1: torchrun + DDP or FSDP (gloo on CPU, nccl on GPU)
        "parallel": Field(STR, lambda s: s in ("ddp", "fsdp"), "one of ddp, fsdp"),
        "checkpoint_every": NONNEG_INT,         # optimiser steps between resume checkpoints (0: epoch ends only)
        "seed": SEED,
    },
    # the donor sweep (paper 5.3): each candidate checkpoint finetuned with the donor recipe at `lr`, grafted onto
    # post at every sweep.lams and sweep.epochs (points graft_donor-<name>_...), and ranked by the cheap signals of
    # stages.donor_choice beside finetune.donor's own graft
    "donors": {
        "candidates": Field(dict, item=NONEMPTY),   # name -> model dir (not finetune.donor: that one is the sweep's)
        "lr": POS_NUM,   # finetune.donor's run at this rate (when finetune.lrs has it) is compared beside them
    },
    "opsd": {
        "alphas": Field(list, lambda v: len(v) > 0, "non-empty",
                        item=Field(NUM, lambda x: 0 <= x <= 1, "in [0, 1]")),
        "top_k": POS_INT,
        "temperature": POS_NUM,
        "max_new_tokens": POS_INT,
        "seed": SEED,
        # what the teacher reads beside the problem: the training row's worked solution and answer, or (knowledge
        # QA pairs; replay traces keep their solution) the passage stating the facts (check_cross)
        "teacher_context": Field(STR, lambda s: s in ("demonstration", "passage"), "one of demonstration, passage"),
    },
    "fisher": {
        "n_rollouts": POS_INT,
        "max_new_tokens": POS_INT,
        "temperature": POS_NUM,
        "seed": SEED,
        "chunk": POS_INT,
        "num_processes": POS_INT,
        "kfac_layers_per_pass": NONNEG_INT,
    },
    # one section per mask kind of sweep.masks, each the params of its mask stages alone (dvc.yaml: mask.<kind>), so
    # the random control's seed reruns only the random masks; the Fisher masks take no settings ({})
    "mask": {**{kind: {} for kind in FISHER_MASKS}, "random": {"seed": SEED}},
    "fisher_merge": {"floor": Field(NUM, positive, "> 0")},
    "sweep": {
        "lams": Field(list, lambda v: len(v) > 0, "non-empty", item=Field(NUM, positive, "> 0")),
        "rhos": Field(list, lambda v: len(v) > 0, "non-empty", item=Field(NUM, lambda x: 0 < x < 1, "in (0, 1)")),
        "fisher_merge_lams": Field(list, lambda v: len(v) > 0, "non-empty",
                                   item=Field(NUM, lambda x: 0 < x <= 1, "in (0, 1]")),
        "epochs": Field(list, lambda v: len(v) > 0, "non-empty", item=POS_INT),  # snapshots that become points
        "masks": Field(list, lambda v: len(v) > 0 and all(m in SWEPT_MASKS for m in v),
                       f"a non-empty list of {', '.join(SWEPT_MASKS)}", item=Field(STR)),
    },
    # base + t * (post - base) at each t: accuracy along the post-training path (is the world smooth there?)
    "diagnostics": {"interpolation": Field(list, lambda v: len(set(v)) == len(v), "without repeats",
                                           item=Field(NUM, lambda x: 0 <= x < 1, "in [0, 1)"))},
    # name -> {delta, lam}: models.post + lam * delta written out as models/exported/<name>
    "export": {"points": Field(dict, item={"delta": Field(STR), "lam": Field(NUM, positive, "> 0")})},
    # points proposed from the predicted retention KL alone (graft.kl_prediction), evaluated beside the sweep
    "propose": {
        "kl_budget": POS_NUM,                   # mean per-token KL (nats) from the post model a proposed point spends
        # measured (lam bisected on the KL on the Fisher's rollouts: forward passes, no engine) | kfac | diagonal |
        # directional (a Fisher form of predict_kl: closed form)
        "predictor": Field(STR, lambda s: s in PREDICTORS, f"one of {', '.join(PREDICTORS)}"),
        "max_lam": POS_NUM,                     # the proposal never extrapolates past this lambda
    },
    # continual learning (graft.chain): steps in order, each landing on the model the step before it made; every
    # method is its own chain. No steps: no chain stage does any work
    "chain": {
        "steps": Field(dict, default={}, item={
            "after": NONEMPTY,                  # the step before it (post for the first): dvc.yaml's path to its model
            "source": NONEMPTY,                 # one of SOURCES or a key of data.offpolicy
            "heldout": Field(dict, default={}), # a data.offpolicy source's held-out suite (a SUITE table)
            "lr": POS_NUM,                      # the step's finetune rate and length (the rest of finetune is shared)
            "epochs": POS_INT,
            "rho": Field(NUM, lambda x: 0 < x < 1, "in (0, 1)"),   # every masked chain's rho at this step
            "lam": POS_NUM,                     # every graft chain's and SFT + merge's lambda at this step
        }),
        "joint": {"lr": POS_NUM, "epochs": POS_INT},   # joint SFT of post on every step's data (the reference)
    },
    "evaluate": {
        "n_samples": POS_INT,
        "temperature": POS_NUM,
        "pass_k": Field(list, lambda v: len(v) > 0, "non-empty", item=POS_INT),
        "max_new_tokens": POS_INT,
        "seed": SEED,
    },
}


PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
DOTTED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")   # point names hold numbers (lam0.5); never . or ..


def check_plain_names(key: str, names, dots: bool = False) -> None:
    """Names that become file names and params keys (suites, aligners): no separators, nothing hidden, and no dots
    unless ``dots`` (a name starting with a letter or digit is never ``.`` or ``..``)."""
    for name in names:
        if not isinstance(name, str) or not (DOTTED_NAME if dots else PLAIN_NAME).fullmatch(name):
            allowed = "letters, digits, _, - and ." if dots else "letters, digits, _ and -"
            raise ParamsError(f"params.yaml: {key} key {name!r} must be a plain name ({allowed}, starting with a "
                              "letter or digit: it becomes a file name and a params key)")


def check_inputs(data: Section, knowledge: Section) -> None:
    """Column mappings name columns of the table's schema; traces come from columns or from messages, not both."""
    inputs = [("data.hard_pool", data.hard_pool, "hard_pool"), ("data.retention", data.retention, "problems")]
    inputs += [(f"data.old_suites.{n}", s, suite_schema(s.grader)) for n, s in data.old_suites.items()]
    inputs += [(f"data.offpolicy.{n}", s, "offpolicy") for n, s in data.offpolicy.items()]
    inputs += [("knowledge.facts", knowledge.facts, "facts")]
    for key, spec, schema in inputs:
        allowed = mappable_columns(schema)
        for ours in spec.columns:
            if ours not in allowed:
                raise ParamsError(f"params.yaml: {key}.columns.{ours} is not a column graft reads (for this input: "
                                  f"{', '.join(allowed)}); keys are our names, values the data set's")
        if MESSAGES in spec.columns:
            both = sorted(set(spec.columns) & {"question", "think", "answer"})
            if both or spec.answer_marker:
                what = f"columns.{both[0]}" if both else "answer_marker"
                raise ParamsError(f"params.yaml: {key}.{what} cannot be set with columns.messages: the question, "
                                  "reasoning and answer come from the conversation")


def check_family(family: Section) -> None:
    """Derived models get plain names, fit their batches, and never start from themselves."""
    check_plain_names("family.imports", family.imports)
    check_plain_names("family.posttrain", family.posttrain)
    both = sorted(set(family.imports) & set(family.posttrain))
    if both:
        raise ParamsError(f"params.yaml: {both[0]!r} is both a family.imports and a family.posttrain key: both write "
                          f"models/family/{both[0]}")
    for name, run in family.posttrain.items():
        key = f"family.posttrain.{name}"
        if run.micro_batch_size > run.global_batch_size:
            raise ParamsError(f"params.yaml: {key}.micro_batch_size ({run.micro_batch_size}) exceeds "
                              f"{key}.global_batch_size ({run.global_batch_size})")
        if Path(run.model).parts[:3] == ("models", "family", name):
            raise ParamsError(f"params.yaml: {key}.model ({run.model}) is this run's own output")
        for ours in run.data.columns:
            if ours not in mappable_columns("offpolicy"):
                raise ParamsError(f"params.yaml: {key}.data.columns.{ours} is not a column graft reads (for this "
                                  f"input: {', '.join(mappable_columns('offpolicy'))})")


def check_donors(p: dict[str, Section]) -> None:
    """Candidates get plain names, differ from the sweep's own donor and from post (a finetune of post is the SFT
    baseline), and never repeat a model."""
    donors, ft, models = p["donors"], p["finetune"], p["models"]
    check_plain_names("donors.candidates", donors.candidates)
    seen: dict[Path, str] = {}
    for name, model in donors.candidates.items():
        where = Path(model)
        if where == Path(ft.donor):
            raise ParamsError(f"params.yaml: donors.candidates.{name} is finetune.donor ({model}): the sweep already "
                              "grafts from it; list only the other candidates")
        if where == Path(models.post):
            raise ParamsError(f"params.yaml: donors.candidates.{name} is models.post ({model}): finetuning post is "
                              "the SFT baseline, not a donor")
        if where in seen:
            raise ParamsError(f"params.yaml: donors.candidates.{name} and donors.candidates.{seen[where]} are the "
                              f"same model ({model})")
        seen[where] = name


# where the sweep writes deltas: the finetunes' (tensors/delta) and the masked ones (tensors/masked)
DELTA_ROOTS = ("tensors/delta", "tensors/masked")


def check_export_delta(key: str, delta: str) -> None:
    """An exported point is post + lam * a delta the sweep wrote: a model directory named as a delta would export
    post plus a whole model (twice post's weights), so the path must be one of the sweep's delta folders."""
    parts = Path(delta).parts
    if Path(delta).is_absolute() or ".." in parts or len(parts) < 3 or "/".join(parts[:2]) not in DELTA_ROOTS:
        raise ParamsError(f"params.yaml: {key} ({delta}) must be a delta the sweep writes, a folder under "
                          f"{' or '.join(DELTA_ROOTS)} (e.g. tensors/masked/kfac_rho0.01_lr0.0001_ep10), not a "
                          "model directory")


def check_text_suites(suites: dict) -> None:
    """A perplexity suite is plain text: no answers to format or mark. The old-task mean is over graded suites (a
    perplexity is not a pass rate), so at least one suite must grade answers."""
    for name, s in sorted(suites.items()):
        if s.grader != PERPLEXITY:
            continue
        for key in ("format", "instruction", "answer_marker"):
            if s[key]:
                raise ParamsError(f"params.yaml: data.old_suites.{name}.{key} is set, but the suite's grader is "
                                  f"{PERPLEXITY}: its rows are plain text scored by likelihood, with no answer")
    if all(s.grader == PERPLEXITY for s in suites.values()):
        raise ParamsError(f"params.yaml: data.old_suites: every suite has grader {PERPLEXITY}; the old-task score is "
                          f"the mean over suites that grade answers ({', '.join(GRADERS)}), so name at least one")


def check_markers(p: dict[str, Section]) -> None:
    """Chat think markers and the answer format's syntax are parsed out of the same turn: a marker that is (or holds,
    or is held in) the text around an answer would cut the answer out as reasoning, and every score would be 0."""
    markers = p["chat"].think_markers
    if p["chat"].thinking_switch == "prefill" and not markers:
        raise ParamsError("params.yaml: chat.thinking_switch is prefill, but chat.think_markers is []: there is no "
                          "empty think block to pre-fill, so thinking off would switch nothing off (set the markers, "
                          "or thinking_switch: none)")
    if len(markers) == 2 and markers[0] == markers[1]:
        raise ParamsError(f"params.yaml: chat.think_markers opens and closes with the same text {markers[0]!r}; "
                          "where the think block ends would be ambiguous")
    formats = {"answer.format": p["answer"].format}
    formats.update({f"data.old_suites.{n}.format": s.format for n, s in sorted(p["data"].old_suites.items())
                    if s.format and s.grader != PERPLEXITY})
    for key, fmt in formats.items():
        check_format_markers(markers, key, fmt)


def check_format_markers(markers, key: str, fmt: str) -> None:
    for m in markers:
        for syntax in ANSWER_SYNTAX[fmt]:
            if m in syntax or syntax in m:
                raise ParamsError(f"params.yaml: chat.think_markers has {m!r}, which collides with {fmt!r} "
                                  f"({key}) writing {syntax!r} around each answer: every answer would be read as "
                                  "reasoning; use the model's own think markers")


def check_cross(p: dict[str, Section]) -> None:
    check_world(p)
    check_markers(p)
    data = p["data"]
    if not data.old_suites:
        raise ParamsError("params.yaml: data.old_suites must name at least one old-task suite")
    check_plain_names("data.old_suites", data.old_suites)
    check_text_suites(data.old_suites)
    check_plain_names("data.offpolicy", data.offpolicy)
    taken = sorted(set(data.offpolicy) & set(SOURCES))
    if taken:
        raise ParamsError(f"params.yaml: data.offpolicy key {taken[0]!r} is the name of a source graft makes itself "
                          f"({', '.join(SOURCES)}); choose another name")
    check_inputs(data, p["knowledge"])
    check_family(p["family"])
    source = p["finetune"].source
    if source not in SOURCES and source not in data.offpolicy:
        raise ParamsError(f"params.yaml: finetune.source must be one of {', '.join(SOURCES)} or a key of "
                          f"data.offpolicy {sorted(data.offpolicy)}, got {source!r}")
    if p["opsd"].teacher_context == "passage" and source != "knowledge":
        raise ParamsError(f"params.yaml: opsd.teacher_context is passage, but finetune.source is {source!r}: only "
                          "the knowledge source has passages (set finetune.source: knowledge, or teacher_context: "
                          "demonstration)")
    check_plain_names("synthself.aligners", p["synthself"].aligners)
    check_plain_names("export.points", p["export"].points, dots=True)
    for name, point in p["export"].points.items():
        check_export_delta(f"export.points.{name}.delta", point.delta)
    if len(set(p["sweep"].lams)) != len(p["sweep"].lams):
        raise ParamsError("params.yaml: sweep.lams has a repeated value")
    for sec, key in (("sweep", "rhos"), ("sweep", "masks"), ("sweep", "fisher_merge_lams"), ("sweep", "epochs"),
                     ("finetune", "lrs"), ("opsd", "alphas")):
        if len(set(p[sec][key])) != len(p[sec][key]):
            raise ParamsError(f"params.yaml: {sec}.{key} has a repeated value")
    check_donors(p)
    check_chain(p)
    kn = p["knowledge"]
    if Path(kn.facts.path) == Path(INVENTED_FACTS) and kn.heldout_phrasings >= kn.invent.phrasings:
        raise ParamsError(f"params.yaml: knowledge.heldout_phrasings ({kn.heldout_phrasings}) must be below "
                          f"knowledge.invent.phrasings ({kn.invent.phrasings}): some phrasings must be trained on")
    gen = p["generation"]
    if gen.vllm_tensor_parallel_size > 1 and gen.backend != "vllm":
        raise ParamsError(f"params.yaml: generation.vllm_tensor_parallel_size is {gen.vllm_tensor_parallel_size}, "
                          f"but generation.backend is {gen.backend}: tensor parallelism is vLLM's (set backend: vllm, "
                          "or the size to 1)")
    ft = p["finetune"]
    if max(p["sweep"].epochs) > ft.epochs:
        raise ParamsError(f"params.yaml: sweep.epochs has {max(p['sweep'].epochs)}, past finetune.epochs "
                          f"({ft.epochs}): no such snapshot")
    if ft.micro_batch_size > ft.global_batch_size:
        raise ParamsError(f"params.yaml: finetune.micro_batch_size ({ft.micro_batch_size}) exceeds "
                          f"finetune.global_batch_size ({ft.global_batch_size})")


def check_chain(p: dict[str, Section]) -> None:
    """Steps in order (each ``after`` the one before it), plain names, a source and a held-out suite per step, and
    one task per step (no two steps scored on one table)."""
    from graft.params import _check_section

    steps, data = p["chain"].steps, p["data"]
    check_plain_names("chain.steps", steps)
    previous = "post"
    tables: dict[str, str] = {}
    for name, step in steps.items():
        key = f"chain.steps.{name}"
        if name == "post":
            raise ParamsError(f"params.yaml: {key}: post is the name of the model every chain starts from; name the "
                              "step after its task")
        if step.after != previous:
            raise ParamsError(f"params.yaml: {key}.after must be {previous!r} (the step before it"
                              f"{'; the first step lands on post' if previous == 'post' else ''}), got {step.after!r}")
        previous = name
        if step.source not in SOURCES and step.source not in data.offpolicy:
            raise ParamsError(f"params.yaml: {key}.source must be one of {', '.join(SOURCES)} or a key of "
                              f"data.offpolicy {sorted(data.offpolicy)}, got {step.source!r}")
        if not step.heldout:
            raise ParamsError(f"params.yaml: {key}.heldout: the step's held-out suite is missing (a table like "
                              "data.old_suites' entries: {path, grader, format, instruction}; graft's mined problems "
                              "are data/mined/heldout.parquet, its facts data/knowledge/heldout.parquet)")
        suite = _check_section(f"{key}.heldout", dict(step.heldout), SUITE)
        if suite.grader == PERPLEXITY:
            raise ParamsError(f"params.yaml: {key}.heldout.grader: a new task is graded by its answers, not "
                              f"{PERPLEXITY}")
        if suite.format:
            check_format_markers(p["chat"].think_markers, f"{key}.heldout.format", suite.format)
        step["heldout"] = suite
        table = str(Path(suite.path))
        old = [n for n, s in sorted(data.old_suites.items()) if Path(s.path) == Path(table)]
        if old:
            raise ParamsError(f"params.yaml: {key}.heldout.path is {table}, the table of old suite {old[0]}: a step "
                              "adds a new task, and the old suites are scored after every step anyway")
        if table in tables:
            raise ParamsError(f"params.yaml: {key} and chain.steps.{tables[table]} are one task (both scored on "
                              f"{table}): a chain adds a new task at every step")
        tables[table] = name


def validate(raw: dict) -> dict[str, Section]:
    out = validate_sections(raw, SCHEMA)
    check_cross(out)
    return out


def load_all(path: str | Path = "params.yaml") -> dict[str, Section]:
    return validate(read_yaml(path))


def load_params(*sections: str, path: str | Path = "params.yaml") -> Section | tuple[Section, ...]:
    """Validate the whole file and return the named sections."""
    allp = load_all(path)
    got = tuple(allp[s] for s in sections)
    return got[0] if len(got) == 1 else got
