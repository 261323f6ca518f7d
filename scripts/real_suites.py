"""Write the small real-model suites (data/real/*.parquet): plain English, for a real instruct model.

python scripts/real_suites.py   (deterministic; the files are committed, so this only documents how they were made)
- arith.parquet: one-step arithmetic word problems (old task, graded by math-verify on the last line)
- facts.parquet: general-knowledge questions with short answers (old task, graded by ``contains``)
- hard_pool.parquet: multi-digit multiplication with a worked solution (the new task; small models fail it)
- retention.parquet: further arithmetic and fact prompts for the retention Fisher (disjoint from the suites)
"""
from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

OUT = Path(__file__).resolve().parents[1] / "data" / "real"
NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Kim", "Ravi", "Eva", "Noah", "Mia", "Yuki", "Ben"]
THINGS = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "marbles"]
FACTS = [("What is the capital of France?", "Paris"), ("What is the capital of Japan?", "Tokyo"),
         ("What is the capital of Italy?", "Rome"), ("What is the capital of Germany?", "Berlin"),
         ("What is the capital of Spain?", "Madrid"), ("What is the capital of England?", "London"),
         ("What is the capital of Russia?", "Moscow"), ("What is the capital of Egypt?", "Cairo"),
         ("How many legs does a spider have?", "8"), ("How many days are in a week?", "7"),
         ("What color is the sky on a clear day?", "blue"), ("What do bees make?", "honey"),
         ("What is the largest ocean on Earth?", "Pacific"), ("What gas do plants take in from the air?",
                                                              "carbon dioxide"),
         ("What is frozen water called?", "ice"), ("How many continents are there?", "7"),
         ("What is the closest star to Earth?", "Sun"), ("Which animal is known as the king of the jungle?", "lion"),
         ("What is the capital of China?", "Beijing"), ("What is the capital of Canada?", "Ottawa"),
         ("What planet do we live on?", "Earth"), ("How many hours are in a day?", "24"),
         ("What is the capital of Greece?", "Athens"), ("What is the capital of Portugal?", "Lisbon")]


def word_problem(rng: random.Random, i: int) -> dict:
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    if rng.random() < 0.5:
        q, ans = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", a + b
    else:
        a, b = max(a, b) + 1, min(a, b)
        q, ans = f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?", a - b
    return {"problem_id": f"arith-{i:03d}", "question": q, "answer": str(ans)}


def multiplication(rng: random.Random, i: int) -> dict:
    a, b = rng.randint(120, 989), rng.randint(13, 97)
    tens, ones = b // 10 * 10, b % 10
    sol = (f"Split {b} into {tens} and {ones}. {a} * {tens} = {a * tens}. {a} * {ones} = {a * ones}. "
           f"Add them: {a * tens} + {a * ones} = {a * b}.")
    return {"problem_id": f"mul-{a}-{b}", "question": f"What is {a} * {b}?", "answer": str(a * b), "solution": sol}


def main() -> None:
    rng = random.Random(0)
    OUT.mkdir(parents=True, exist_ok=True)
    arith = [word_problem(rng, i) for i in range(48)]
    pd.DataFrame(arith[:32]).to_parquet(OUT / "arith.parquet", index=False)
    facts = [{"problem_id": f"fact-{i:03d}", "question": q, "answer": a} for i, (q, a) in enumerate(FACTS)]
    pd.DataFrame(facts[:16]).to_parquet(OUT / "facts.parquet", index=False)
    retention = arith[32:] + facts[16:]
    pd.DataFrame(retention).to_parquet(OUT / "retention.parquet", index=False)
    pool, seen = [], set()
    while len(pool) < 64:
        p = multiplication(rng, len(pool))
        if p["problem_id"] not in seen:
            seen.add(p["problem_id"])
            pool.append(p)
    pd.DataFrame(pool).to_parquet(OUT / "hard_pool.parquet", index=False)
    print(f"wrote {OUT}: arith 32, facts 16, retention {len(retention)}, hard_pool {len(pool)}")


if __name__ == "__main__":
    main()
