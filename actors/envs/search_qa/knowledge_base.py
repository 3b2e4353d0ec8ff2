"""A generated world of countries, cities, people, companies and works, written up as
encyclopedia passages (one per entity, like Wikipedia leads). Names are made-up words, so a
model cannot answer from memory and must search; every name is unique, so a question has
exactly one answer and a search for a name finds its passage."""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

DEFAULT_KB_SEED = 1729

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "th", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "n", "r", "l", "s", "th", "m")
OCCUPATIONS = (
    "physicist",
    "novelist",
    "film director",
    "architect",
    "chemist",
    "painter",
    "composer",
    "economist",
    "engineer",
    "mathematician",
)
INDUSTRIES = {
    "technology": "Systems",
    "pharmaceutical": "Pharma",
    "automotive": "Motors",
    "food": "Foods",
    "media": "Media",
    "aerospace": "Aeronautics",
    "energy": "Power",
    "shipping": "Lines",
}
FILM_GENRES = ("drama", "comedy", "thriller", "science fiction", "documentary", "war")
TITLE_NOUNS = ("Garden", "River", "Winter", "Lantern", "Harbour", "Mirror", "Orchard", "Tower", "Voyage", "Silence")
CURRENCY_NOUNS = ("mark", "crown", "florin", "ducat", "real", "dinar")


@dataclass(frozen=True)
class Country:
    """A country; its capital is one of its cities."""

    name: str  # e.g. "Vestoria"
    demonym: str  # adjective for its people, e.g. "Vestorian"
    capital: str  # city name
    language: str  # official language, e.g. "Vestorian"
    currency: str  # e.g. "Vestorian crown"


@dataclass(frozen=True)
class City:
    """A city in a country."""

    name: str  # e.g. "Dralith"
    country: str  # country name
    founded_year: int  # year the city was founded
    population: int  # inhabitants, rounded


@dataclass(frozen=True)
class Person:
    """A person born in a city."""

    name: str  # "First Last", both made-up words
    birth_year: int  # year of birth
    birth_city: str  # city name
    occupation: str  # one of OCCUPATIONS


@dataclass(frozen=True)
class Organisation:
    """A company; each founder founded exactly one."""

    name: str  # e.g. "Korvath Systems"
    industry: str  # key of INDUSTRIES
    founder: str  # person name
    founded_year: int  # year founded
    headquarters: str  # city name


@dataclass(frozen=True)
class Work:
    """A film or a novel; each creator made exactly one."""

    title: str  # e.g. "The Mirror of Selvane"
    kind: str  # "film" or "novel"
    year: int  # release or publication year
    creator: str  # person name (director of a film, author of a novel)
    genre: str  # e.g. "thriller"


@dataclass(frozen=True)
class Passage:
    """One encyclopedia entry."""

    title: str  # the entity's name
    text: str  # the entry, a few sentences


@dataclass(frozen=True)
class KnowledgeBase:
    """The generated world and its passages."""

    countries: dict[str, Country]  # name -> country
    cities: dict[str, City]  # name -> city
    people: dict[str, Person]  # name -> person
    organisations: dict[str, Organisation]  # name -> company
    works: dict[str, Work]  # title -> work
    passages: list[Passage]  # one per entity


class _NameMaker:
    """Made-up words, never the same one twice, so every name token points at one entity."""

    def __init__(self, rng: random.Random):
        self.rng, self.used = rng, set()

    def word(self) -> str:
        while True:
            syllables = self.rng.randint(2, 3)
            word = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables))
            word = (word + self.rng.choice(_CODAS)).capitalize()
            if word not in self.used:
                self.used.add(word)
                return word


def _person_passage(person: Person, kb_parts: dict) -> str:
    city = kb_parts["cities"][person.birth_city]
    country = kb_parts["countries"][city.country]
    text = (
        f"{person.name} (born {person.birth_year}) is a {country.demonym} {person.occupation}. "
        f"{person.name} was born in {city.name}, {country.name}, in {person.birth_year}."
    )
    if person.name in kb_parts["founded"]:
        organisation = kb_parts["founded"][person.name]
        text += f" In {organisation.founded_year} {person.name.split()[1]} founded {organisation.name}."
    if person.name in kb_parts["created"]:
        work = kb_parts["created"][person.name]
        text += f" {person.name.split()[1]} is best known for the {work.kind} {work.title} ({work.year})."
    return text


def _generate(
    seed: int,
    n_countries: int = 12,
    cities_per_country: int = 5,
    n_people: int = 240,
    n_organisations: int = 80,
    n_works: int = 100,
) -> KnowledgeBase:
    rng = random.Random(seed)
    names = _NameMaker(rng)
    countries, cities = {}, {}
    for _ in range(n_countries):
        stem = names.word()
        country_cities = [
            City(names.word(), stem + "ia", rng.randint(700, 1850), rng.randrange(20_000, 3_000_000, 1000))
            for _ in range(cities_per_country)
        ]
        cities.update({city.name: city for city in country_cities})
        countries[stem + "ia"] = Country(
            stem + "ia", stem + "ian", country_cities[0].name, stem + "ian", f"{stem}ian {rng.choice(CURRENCY_NOUNS)}"
        )
    city_names = sorted(cities)
    people = {}
    while len(people) < n_people:
        name = f"{names.word()} {names.word()}"
        people[name] = Person(name, rng.randint(1900, 1995), rng.choice(city_names), rng.choice(OCCUPATIONS))
    person_names = list(people)
    founders = rng.sample(person_names, n_organisations)
    organisations = {}
    for founder in founders:
        industry = rng.choice(sorted(INDUSTRIES))
        name = f"{names.word()} {INDUSTRIES[industry]}"
        founded = max(people[founder].birth_year + 22, rng.randint(1930, 2015))
        organisations[name] = Organisation(name, industry, founder, founded, rng.choice(city_names))
    directors = [name for name in person_names if people[name].occupation == "film director"]
    novelists = [name for name in person_names if people[name].occupation == "novelist"]
    creators = [(name, "film") for name in directors] + [(name, "novel") for name in novelists]
    works = {}
    for creator, kind in rng.sample(creators, min(n_works, len(creators))):
        title = f"The {rng.choice(TITLE_NOUNS)} of {names.word()}"
        works[title] = Work(
            title,
            kind,
            people[creator].birth_year + rng.randint(25, 60),
            creator,
            rng.choice(FILM_GENRES) if kind == "film" else "literary",
        )
    kb_parts = {
        "cities": cities,
        "countries": countries,
        "founded": {o.founder: o for o in organisations.values()},
        "created": {w.creator: w for w in works.values()},
    }
    passages = [
        Passage(
            c.name,
            f"{c.name} is a country whose capital is {c.capital}. Its official language is "
            f"{c.language} and its currency is the {c.currency}.",
        )
        for c in countries.values()
    ]
    passages += [
        Passage(
            c.name,
            f"{c.name} is a city in {c.country}"
            f"{' and its capital' if countries[c.country].capital == c.name else ''}. "
            f"It was founded in {c.founded_year} and has about {c.population:,} inhabitants.",
        )
        for c in cities.values()
    ]
    passages += [Passage(p.name, _person_passage(p, kb_parts)) for p in people.values()]
    passages += [
        Passage(
            o.name,
            f"{o.name} is a {o.industry} company founded in {o.founded_year} by {o.founder}. "
            f"It is headquartered in {o.headquarters}.",
        )
        for o in organisations.values()
    ]
    passages += [
        Passage(
            w.title,
            f"{w.title} is a {w.year} {w.genre} {w.kind} "
            f"{'directed' if w.kind == 'film' else 'written'} by {w.creator}.",
        )
        for w in works.values()
    ]
    return KnowledgeBase(countries, cities, people, organisations, works, passages)


@functools.lru_cache(maxsize=4)
def load_knowledge_base(seed: int = DEFAULT_KB_SEED) -> KnowledgeBase:
    """The knowledge base of `seed`, generated once per process and shared by every env instance."""
    return _generate(seed)
