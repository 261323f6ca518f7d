"""Write the small real-model suites (data/real/*.parquet): plain English, for a real instruct model.

python scripts/real_suites.py   (deterministic; the files are committed, so this only documents how they were made)
- arith.parquet: one-step arithmetic word problems (old task, graded by math-verify on the last line)
- facts.parquet: general-knowledge questions with short answers (old task, graded by ``contains``)
- hard_pool.parquet: multi-digit multiplication with a worked solution (the new task; small models fail it)
- retention.parquet: further arithmetic and fact prompts for the retention Fisher (disjoint from the suites)
The real family's post-training (params ``family.posttrain``, README "What a real model shows"), from a second seed so
the files above stay as they were:
- posttrain.parquet: one- and two-step word problems with a short worked answer (question/think/answer traces): the
  narrow skill post-training gives the model, graded by the arith suite
- arith_replay.parquet: further such problems with solutions (``hard_pool`` schema): the knowledge scenario's replay
  of the post-training task (its teacher traces, paper Appendix C)
Every question of these two is distinct from each other and from the suites' and retention's.
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

# further general-knowledge questions: research/known_facts.py keeps those the base model answers greedily
GENERAL = [("What is the capital of Ireland?", "Dublin"), ("What is the capital of Austria?", "Vienna"),
           ("What is the capital of Norway?", "Oslo"), ("What is the capital of Sweden?", "Stockholm"),
           ("What is the capital of Poland?", "Warsaw"), ("What is the capital of Mexico?", "Mexico City"),
           ("What is the capital of India?", "New Delhi"), ("What is the capital of Australia?", "Canberra"),
           ("What is the capital of Kenya?", "Nairobi"), ("What is the capital of Argentina?", "Buenos Aires"),
           ("What is the capital of the United States?", "Washington"), ("What is the capital of Turkey?", "Ankara"),
           ("How many sides does a triangle have?", "3"), ("How many sides does a square have?", "4"),
           ("How many months are in a year?", "12"), ("How many minutes are in an hour?", "60"),
           ("How many legs does a dog have?", "4"), ("How many wheels does a bicycle have?", "2"),
           ("What color is grass?", "green"), ("What color is snow?", "white"),
           ("What color are ripe bananas?", "yellow"), ("What is the largest planet in our solar system?", "Jupiter"),
           ("Which planet is known as the Red Planet?", "Mars"), ("What is the chemical symbol for gold?", "Au"),
           ("What is the chemical symbol for water?", "H2O"), ("What do cows drink?", "water"),
           ("What is the opposite of hot?", "cold"), ("What is the opposite of up?", "down"),
           ("Which animal says meow?", "cat"), ("Which animal barks?", "dog"),
           ("What is the boiling point of water in degrees Celsius?", "100"),
           ("What is the freezing point of water in degrees Celsius?", "0"),
           ("Who wrote Romeo and Juliet?", "Shakespeare"), ("Who painted the Mona Lisa?", "Leonardo da Vinci"),
           ("What is the tallest mountain in the world?", "Everest"), ("What is the longest river in Africa?", "Nile"),
           ("What language is spoken in Brazil?", "Portuguese"), ("What language is spoken in France?", "French"),
           ("What currency is used in Japan?", "yen"), ("What is the largest animal on Earth?", "blue whale"),
           ("What is the main ingredient of bread?", "flour"), ("What do caterpillars turn into?", "butterfly"),
           ("How many players are on a soccer team on the field?", "11"), ("What is 10 times 10?", "100"),
           ("What is the first letter of the English alphabet?", "A"), ("What shape is a ball?", "round"),
           ("What organ pumps blood through the body?", "heart"), ("What is the hardest natural substance?",
                                                                    "diamond")]


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


def worked_problem(rng: random.Random, i: int, prefix: str) -> dict:
    """A one- or two-step word problem in the suite's style, with the arithmetic written out."""
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    if rng.random() < 0.5:
        if rng.random() < 0.5:
            q, ans = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", a + b
            think = f"{name} starts with {a} {thing} and gets {b} more: {a} + {b} = {ans}."
        else:
            a, b = max(a, b) + 1, min(a, b)
            q, ans = f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?", a - b
            think = f"{name} starts with {a} {thing} and gives away {b}: {a} - {b} = {ans}."
    else:
        c = rng.randint(1, a + b - 1)
        q = (f"{name} has {a} {thing}, gets {b} more and then gives away {c}. How many {thing} does {name} have "
             "now?")
        ans = a + b - c
        think = f"{name} starts with {a} {thing}. {a} + {b} = {a + b}. Then {a + b} - {c} = {ans}."
    return {"problem_id": f"{prefix}-{i:04d}", "question": q, "think": think, "answer": str(ans)}


def write_posttraining(taken: set[str]) -> tuple[int, int]:
    rng = random.Random(1)
    rows = []
    while len(rows) < 768 + 128:
        r = worked_problem(rng, len(rows), "post")
        if r["question"] not in taken:
            taken.add(r["question"])
            rows.append(r)
    post = pd.DataFrame([{k: r[k] for k in ("question", "think", "answer")} for r in rows[:768]])
    post.to_parquet(OUT / "posttrain.parquet", index=False)
    replay = pd.DataFrame([{"problem_id": f"replay-{i:03d}", "question": r["question"], "answer": r["answer"],
                            "solution": r["think"]} for i, r in enumerate(rows[768:])])
    replay.to_parquet(OUT / "arith_replay.parquet", index=False)
    return len(post), len(replay)


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
    n_post, n_replay = write_posttraining({r["question"] for r in arith + facts + pool})
    print(f"wrote {OUT}: arith 32, facts 16, retention {len(retention)}, hard_pool {len(pool)}, "
          f"posttrain {n_post}, arith_replay {n_replay}")


if __name__ == "__main__":
    main()
