"""fisher: diagonal retention Fisher of the post model on its own samples for old-task prompts.

-> tensors/fisher/diagonal.safetensors (fp32, keyed by parameter name), reports/fisher.json
"""
from __future__ import annotations

from graft.atomic import atomic_file, write_json
from graft.chat import render_prompt
from graft.fisher import estimate_diag_fisher
from graft.generation import SamplingSpec, open_generator
from graft.modeling import load_model, load_tokenizer
from graft.params import load_params
from graft.tables import read_table
from graft.tensors import save_tensors


def main() -> None:
    p, gen, chat, models, data = load_params("fisher", "generation", "chat", "models", "data")
    retention = read_table(data.retention, "problems")
    questions = [retention["question"][i % len(retention)] for i in range(p.n_rollouts)]
    tokenizer = load_tokenizer(models.post, models.trust_remote_code)
    prompts = [render_prompt(q, chat.thinking) for q in questions]
    generator = open_generator(models.post, gen, models.trust_remote_code)
    outs = generator.generate(prompts, SamplingSpec(n=1, temperature=p.temperature, top_p=gen.top_p,
                                                    max_new_tokens=p.max_new_tokens, seed=p.seed))
    generator.close()
    rollouts = [(tokenizer(pr, add_special_tokens=False)["input_ids"], list(o[0].token_ids))
                for pr, o in zip(prompts, outs) if o[0].token_ids]
    model = load_model(models.post, "float32", models.trust_remote_code)
    fisher = estimate_diag_fisher(model, rollouts, tokenizer.pad_token_id)
    with atomic_file("tensors/fisher/diagonal.safetensors") as tmp:
        save_tensors(tmp, fisher)
    total = sum(float(v.sum()) for v in fisher.values())
    write_json("reports/fisher.json", {"rollouts": len(rollouts), "trace": total,
                                       "mean_response_tokens": sum(len(r) for _, r in rollouts) / len(rollouts)})
    print(f"fisher: {len(rollouts)} rollouts, trace {total:.4g}")


if __name__ == "__main__":
    main()
