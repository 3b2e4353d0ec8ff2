"""Questions over the knowledge base, by template, in the three shapes search-augmented QA
benchmarks use: single_hop (Natural Questions: one fact in one passage), bridge (HotpotQA:
find an entity, then a fact about it in its own passage) and comparison (HotpotQA: look up two
entities and compare)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from actors.envs.search_qa.knowledge_base import KnowledgeBase

TASK_TYPES = ("single_hop", "bridge", "comparison")


@dataclass(frozen=True)
class Question:
    """A question with its gold answer and the searches that reach it."""

    text: str  # the question asked, e.g. "where was Krevor Droupipi born?"
    answer: str  # gold answer
    task_type: str  # one of TASK_TYPES
    hops: tuple[str, ...]  # entity names to search, in order; each later one is named in an earlier passage


def _single_hop(rng: random.Random, kb: KnowledgeBase) -> Question:
    kind = rng.choice(("born", "founder", "creator", "capital", "founded_year", "city_country"))
    if kind == "born":
        person = kb.people[rng.choice(sorted(kb.people))]
        return Question(f"where was {person.name} born?", person.birth_city, "single_hop", (person.name,))
    if kind in ("founder", "founded_year"):
        company = kb.organisations[rng.choice(sorted(kb.organisations))]
        if kind == "founder":
            return Question(f"who founded {company.name}?", company.founder, "single_hop", (company.name,))
        return Question(
            f"in what year was {company.name} founded?", str(company.founded_year), "single_hop", (company.name,)
        )
    if kind == "creator":
        work = kb.works[rng.choice(sorted(kb.works))]
        verb = "directed the film" if work.kind == "film" else "wrote the novel"
        return Question(f"who {verb} {work.title}?", work.creator, "single_hop", (work.title,))
    if kind == "capital":
        country = kb.countries[rng.choice(sorted(kb.countries))]
        return Question(f"what is the capital of {country.name}?", country.capital, "single_hop", (country.name,))
    city = kb.cities[rng.choice(sorted(kb.cities))]
    return Question(f"in which country is {city.name}?", city.country, "single_hop", (city.name,))


def _bridge(rng: random.Random, kb: KnowledgeBase) -> Question:
    kind = rng.choice(
        ("creator_birthplace", "founder_birth_year", "founder_company_city", "city_capital", "person_language")
    )
    if kind == "creator_birthplace":
        work = kb.works[rng.choice(sorted(kb.works))]
        role = "director of the film" if work.kind == "film" else "author of the novel"
        return Question(
            f"in which city was the {role} {work.title} born?",
            kb.people[work.creator].birth_city,
            "bridge",
            (work.title, work.creator),
        )
    if kind == "founder_birth_year":
        company = kb.organisations[rng.choice(sorted(kb.organisations))]
        return Question(
            f"in what year was the founder of {company.name} born?",
            str(kb.people[company.founder].birth_year),
            "bridge",
            (company.name, company.founder),
        )
    if kind == "founder_company_city":
        company = kb.organisations[rng.choice(sorted(kb.organisations))]
        return Question(
            f"in which city is the company founded by {company.founder} headquartered?",
            company.headquarters,
            "bridge",
            (company.founder, company.name),
        )
    if kind == "city_capital":
        capitals = {country.capital for country in kb.countries.values()}
        city = kb.cities[rng.choice(sorted(set(kb.cities) - capitals))]
        return Question(
            f"what is the capital of the country where {city.name} is located?",
            kb.countries[city.country].capital,
            "bridge",
            (city.name, city.country),
        )
    person = kb.people[rng.choice(sorted(kb.people))]
    country = kb.countries[kb.cities[person.birth_city].country]
    return Question(
        f"what is the official language of the country where {person.name} was born?",
        country.language,
        "bridge",
        (person.name, country.name),
    )


def _comparison(rng: random.Random, kb: KnowledgeBase) -> Question:
    kind = rng.choice(("born_first", "founded_first", "same_country"))
    if kind == "founded_first":
        first, second = (kb.organisations[name] for name in rng.sample(sorted(kb.organisations), 2))
        while first.founded_year == second.founded_year:
            second = kb.organisations[rng.choice(sorted(kb.organisations))]
        earlier = min(first, second, key=lambda company: company.founded_year)
        return Question(
            f"which company was founded earlier, {first.name} or {second.name}?",
            earlier.name,
            "comparison",
            (first.name, second.name),
        )
    first, second = (kb.people[name] for name in rng.sample(sorted(kb.people), 2))
    if kind == "same_country":
        same = kb.cities[first.birth_city].country == kb.cities[second.birth_city].country
        return Question(
            f"were {first.name} and {second.name} born in the same country?",
            "yes" if same else "no",
            "comparison",
            (first.name, second.name),
        )
    while first.birth_year == second.birth_year:
        second = kb.people[rng.choice(sorted(kb.people))]
    earlier = min(first, second, key=lambda person: person.birth_year)
    return Question(
        f"who was born first, {first.name} or {second.name}?", earlier.name, "comparison", (first.name, second.name)
    )


def build_question(kb: KnowledgeBase, seed: int) -> Question:
    """The question of task `seed`: a task type, a template of that type, and the entities it asks about."""
    rng = random.Random(seed)
    task_type = rng.choice(TASK_TYPES)
    return {"single_hop": _single_hop, "bridge": _bridge, "comparison": _comparison}[task_type](rng, kb)
