"""Write the small real-model suites (data/real/*.parquet): plain English, for a real instruct model.

python scripts/real_suites.py   (deterministic; the files are committed, so this only documents how they were made)
- arith.parquet: one-step arithmetic word problems (old task, graded by math-verify on the last line)
- facts.parquet: general-knowledge questions with short answers (old task, graded by ``contains``)
- hard_pool.parquet: multi-digit multiplication with a worked solution (the new task; small models fail it)
- retention.parquet: further arithmetic and fact prompts for the retention Fisher (disjoint from the suites)
The real family's post-training (params ``family.posttrain``, docs/findings/real-model.md), from a second seed so
the files above stay as they were:
- posttrain.parquet: one- and two-step word problems with a short worked answer (question/think/answer traces): the
  narrow skill post-training gives the model, graded by the arith suite
- arith_replay.parquet: further such problems with solutions (``hard_pool`` schema): the knowledge scenario's replay
  of the post-training task (its teacher traces, paper Appendix C)
Every question of these two is distinct from each other and from the suites' and retention's.
- english.parquet: short passages of plain English prose written for this project (``texts`` schema), the held-out
  text of the ``perplexity`` old suite (no training table holds them)
A shorter hard skill, from a third seed (the multiplication above is one no method learned, docs/findings/real-model.md "The hard-skill
scenario"): a two-digit number times a one-digit number, worked the same way:
- hard_pool_short.parquet: 256 such problems with a worked solution (``hard_pool`` schema)
- hard_probe_short.parquet: 64 more, disjoint from the pool: where research/hard_skill_probe.py measures whether the
  skill is learnable from the pool's traces at all, so that choice is never made on a scenario's evaluation set
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

# plain English prose, written for this project (never trained on): the perplexity suite's held-out text
ENGLISH = [
    "The morning train was late again, so the platform filled with people holding coffee and checking their phones. "
    "When it finally arrived, everyone squeezed in without a word.",
    "My grandmother kept a small garden behind her house. Every spring she planted tomatoes, beans and a row of "
    "sunflowers that grew taller than the fence.",
    "Rain fell all afternoon, and the streets turned into shallow rivers. Children in bright boots ran from puddle to "
    "puddle while their parents waited under the shop awnings.",
    "The library closes at eight on weekdays and at five on Saturdays. Books can be returned at any time through the "
    "slot beside the main door.",
    "He opened the old box carefully. Inside were letters tied with string, a pair of glasses and a photograph of two "
    "young people standing by the sea.",
    "Bread is made from flour, water, salt and yeast. The dough is kneaded, left to rise, shaped into loaves and baked "
    "in a hot oven until the crust turns brown.",
    "The meeting started ten minutes late because the projector would not turn on. In the end we talked through the "
    "plan with a whiteboard and a marker.",
    "A cold wind came down from the hills in the evening. The farmers brought the sheep into the barn and closed the "
    "heavy wooden doors.",
    "She learned to swim the summer she turned seven. By the end of August she could cross the lake and back without "
    "stopping to rest.",
    "The museum has a room full of clocks from many countries. Some are larger than a person, and one is small enough "
    "to fit inside a ring.",
    "After dinner we walked down to the harbor to watch the boats come in. The sky was orange, and the gulls were loud "
    "above the fishing nets.",
    "Most cats sleep for more than half of the day. They are often awake at dawn and at dusk, when their eyes work "
    "best in the low light.",
    "The recipe asks for two eggs, a cup of milk and a spoon of sugar. Mix them well before you add the flour, or the "
    "batter will have lumps.",
    "When the power went out, the whole street went quiet. Neighbors came outside with candles and talked until the "
    "lights came back on.",
    "Our teacher asked us to write about a place we love. I chose the small bridge near my school, where I stop every "
    "day to look at the water.",
    "The road climbed slowly through the forest. Every few miles there was a clearing with a view of the valley and "
    "the river far below.",
    "He fixed the broken chair with glue and two small nails. It was not pretty, but it held his weight, and that was "
    "enough for him.",
    "In winter the pond behind the school freezes solid. On weekends families bring skates, hot drinks and sometimes "
    "a radio for music.",
    "The shop on the corner sells newspapers, sweets and batteries. The owner knows every customer by name and asks "
    "about their families.",
    "Snow began to fall just before midnight. By morning the cars were white shapes and the town was silent except for "
    "the sound of shovels.",
    "The doctor told him to drink more water and to walk for half an hour each day. After a month he felt stronger "
    "and slept better.",
    "Two friends planned a trip along the coast. They packed a tent, a map and enough food for a week, and left before "
    "sunrise.",
    "The old clock in the hall stopped at a quarter past three. Nobody in the family knew how to wind it, so it stayed "
    "that way for years.",
    "Bees visit thousands of flowers in a single day. They carry pollen from one plant to the next, which helps fruit "
    "and seeds to grow.",
]

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


def short_multiplication(rng: random.Random) -> dict:
    a, b = rng.choice([n for n in range(12, 99) if n % 10]), rng.randint(3, 9)
    tens, ones = a // 10 * 10, a % 10
    sol = (f"Split {a} into {tens} and {ones}. {tens} * {b} = {tens * b}. {ones} * {b} = {ones * b}. "
           f"Add them: {tens * b} + {ones * b} = {a * b}.")
    return {"problem_id": f"smul-{a}-{b}", "question": f"What is {a} * {b}?", "answer": str(a * b), "solution": sol}


def distinct_rows(make, n: int, taken: set[str]) -> list[dict]:
    """``n`` rows from ``make(i)`` (``i``: rows kept so far) whose questions are in no table so far (``taken`` grows
    with them)."""
    rows: list[dict] = []
    while len(rows) < n:
        r = make(len(rows))
        if r["question"] not in taken:
            taken.add(r["question"])
            rows.append(r)
    return rows


def write_short_multiplication(taken: set[str]) -> tuple[int, int]:
    rng = random.Random(2)
    rows = distinct_rows(lambda i: short_multiplication(rng), 256 + 64, taken)
    pd.DataFrame(rows[:256]).to_parquet(OUT / "hard_pool_short.parquet", index=False)
    pd.DataFrame(rows[256:]).to_parquet(OUT / "hard_probe_short.parquet", index=False)
    return 256, 64


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
    rows = distinct_rows(lambda i: worked_problem(rng, i, "post"), 768 + 128, taken)
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
    pd.DataFrame({"text_id": [f"en-{i:02d}" for i in range(len(ENGLISH))], "text": ENGLISH}).to_parquet(
        OUT / "english.parquet", index=False)
    taken = {r["question"] for r in arith + facts + pool}
    n_post, n_replay = write_posttraining(taken)
    n_short, n_probe = write_short_multiplication(taken)
    print(f"wrote {OUT}: arith 32, facts 16, retention {len(retention)}, hard_pool {len(pool)}, "
          f"posttrain {n_post}, arith_replay {n_replay}, english {len(ENGLISH)}, hard_pool_short {n_short}, "
          f"hard_probe_short {n_probe}")


if __name__ == "__main__":
    main()
