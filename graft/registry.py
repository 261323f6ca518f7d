"""The names graft's params, stages and reports share: answer formats, graders, mask kinds, off-policy sources,
methods. One place spells each, and this module imports nothing, so reading a name (the schema does, for every
stage) makes no stage depend on the code behind it: an edit to answer grading reruns no mask or merge."""
from __future__ import annotations

# chat: how thinking is switched off (graft.chat.ChatSpec) and how a final answer is written (graft.chat.AnswerFormat)
SWITCHES = ("template", "prefill", "none")
FORMATS = ("answer_tag", "boxed", "final_line")
# the text each format writes around an answer (final_line writes none): chat markers must not collide with it
ANSWER_TAG = ("<answer>", "</answer>")
ANSWER_SYNTAX = {"answer_tag": ANSWER_TAG, "boxed": ("\\boxed{", "}"), "final_line": ()}

# old-task suites: graded answers, or plain text scored by its likelihood (graft.grading.Grader)
GRADERS = ("math", "fact", "contains")
PERPLEXITY = "perplexity"
SUITE_KINDS = (*GRADERS, PERPLEXITY)


def suite_schema(kind: str) -> str:
    """The table schema (graft.tables.SCHEMAS) of a suite scored by ``kind``."""
    return "texts" if kind == PERPLEXITY else "problems"


# masks M_rho: the retention Fisher's two forms, the random control of the same size, and no mask at all
FISHER_MASKS = ("diagonal", "kfac")
SWEPT_MASKS = (*FISHER_MASKS, "random")        # sweep.masks
MASK_KINDS = ("none", *SWEPT_MASKS)            # graft.merging.MaskPlan.kind

# KL prediction 1/2 D^T F D: the Fisher forms it reads, and propose.predictor (measured bisects on the measured KL)
FISHER_FORMS = ("kfac", "diagonal", "directional")
PREDICTORS = ("measured", *FISHER_FORMS)

# the pipeline's own off-policy sources (data/offpolicy/<source>.parquet); a user's traces are data.offpolicy keys
SOURCES = ("teacher", "synthself", "star", "knowledge")

# methods: a point's `method` in reports/points/*.json and reports/points.parquet
GRAFT = "graft"                     # post + lam * delta, unmasked
SFT_MERGE = "sft_merge"
DONOR_METHOD = "graft_donor"        # a graft from a candidate of the donor sweep (donors.candidates)
DIAGNOSTIC = "base_to_post"         # interpolation points of the post-training path (no method, on no frontier)
PROPOSED_PREFIX = "proposed_"       # a point the propose stage chose: proposed_<family>


def masked_method(kind: str) -> str:
    """The method of a graft masked by ``kind`` (one of SWEPT_MASKS)."""
    return f"{GRAFT}_{kind}"


METHODS = ("post", "sft", SFT_MERGE, "fisher_merge", "opsd", GRAFT, *map(masked_method, SWEPT_MASKS), DONOR_METHOD)


def method_order(methods) -> list[str]:
    """The methods present, in METHODS order, then the proposed ones in their families' order, then others sorted."""
    present = set(methods)
    order = [m for m in METHODS if m in present]
    order += [f"{PROPOSED_PREFIX}{m}" for m in METHODS if f"{PROPOSED_PREFIX}{m}" in present]
    return order + sorted(present - set(order))
