"""The demo model's small world: a grammar of children's stories and chat turns.

``scripts/train_demo_model.py`` generates its whole training corpus from
this module, and the demo-model tests parse the model's output with it, so
that "the model writes grammatical text" is checked against the very grammar
it was trained on.

Invariants:
- A story is the parts of ``STORY_PARTS`` in order, one alternative each,
  joined by single spaces. An alternative is a template whose ``{slots}`` are
  either cast slots (``CAST_SLOTS``: chosen once per story, the same in every
  sentence; pronouns follow the name's gender) or free slots (``WORDS``: a
  new choice at every use). Slot values are plain text, never templates.
- ``parse_story`` accepts exactly the texts ``make_story`` can produce
  (cast slots must agree across sentences; the friend is not the hero).
- Choices are Zipf-weighted (the first option is the most likely), so that
  greedy decoding has clear winners instead of near-ties.
- A chat answer is a function of the question alone (``answer_for``), except
  for story requests, whose answer is any story (about the animal asked for).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field

# name -> gender ("she" / "he"); most likely first.
NAMES = {
    "Lily": "she", "Tom": "he", "Mia": "she", "Ben": "he", "Anna": "she", "Max": "he",
    "Rosa": "she", "Sam": "he", "Zoe": "she", "Leo": "he", "Ella": "she", "Jack": "he",
}
PRONOUNS = {"she": ("she", "She", "her"), "he": ("he", "He", "his")}


@dataclass(frozen=True)
class Animal:
    sound: str
    home: str
    food: str
    legs: str


ANIMALS = {
    "cat": Animal("meow", "in a warm house", "fish", "four"),
    "dog": Animal("woof", "in a dog house", "bones", "four"),
    "bunny": Animal("nothing, but it can thump its feet", "in a hole in the ground", "carrots", "four"),
    "bear": Animal("grr", "in a big cave", "honey", "four"),
    "duck": Animal("quack", "by the pond", "bread and seeds", "two"),
    "fox": Animal("yip", "in a den in the forest", "berries and mice", "four"),
    "frog": Animal("ribbit", "in the pond", "flies", "four"),
    "mouse": Animal("squeak", "in a little hole in the wall", "cheese", "four"),
    "bird": Animal("tweet", "in a nest in a tree", "seeds and worms", "two"),
    "pig": Animal("oink", "on a farm", "apples and corn", "four"),
    "cow": Animal("moo", "on a farm", "grass", "four"),
    "sheep": Animal("baa", "on a farm", "grass", "four"),
    "horse": Animal("neigh", "in a barn", "hay and apples", "four"),
    "lion": Animal("roar", "in the grasslands", "meat", "four"),
}

COLORS_OF_THINGS = {
    "the sky": "blue", "grass": "green", "the sun": "yellow", "snow": "white", "an apple": "red",
    "a banana": "yellow", "a carrot": "orange", "the sea": "blue", "a leaf": "green", "the night": "dark",
    "a strawberry": "red", "a cloud": "white",
}

# Free slots: a new Zipf-weighted choice at every use.
WORDS = {
    "adj": ["little", "big", "happy", "kind", "small", "brave", "shy", "clever", "funny", "tiny"],
    "home": ["a small house", "a big forest", "a green garden", "a quiet town", "a cozy house",
             "a little village", "a tall tree", "a sunny field"],
    "family": ["mom", "dad", "grandma", "grandpa", "sister", "brother"],
    "activity": ["play with a red ball", "run in the park", "read books", "sing songs", "draw pictures",
                 "jump in puddles", "climb trees", "look at the stars", "pick flowers", "dance in the rain"],
    "purpose": ["play", "look for flowers", "see the water", "find some food", "fly a kite", "watch the birds"],
    "time": ["morning", "afternoon", "evening", "sunny day", "rainy day"],
    "played": ["played with a ball", "ran and jumped", "sang happy songs", "played hide and seek",
               "built a big tower", "danced and laughed"],
    "hiding": ["a big tree", "a rock", "a bush", "a bench", "a pile of leaves"],
    "feeling": ["happy", "glad", "proud", "warm inside"],
    "snack": ["an apple", "some bread", "a cookie", "some berries", "a piece of cake"],
}

# Cast slots: chosen once per story.
CAST_DOMAINS = {
    "Name": list(NAMES),
    "Friend": list(NAMES),
    "animal": list(ANIMALS),
    "animal2": list(ANIMALS),
    "place": ["the park", "the river", "the forest", "the beach", "the hill", "the lake", "the garden"],
    "lost": ["ball", "hat", "kite", "toy", "book", "scarf"],
}
# Filled in from the names' genders, never chosen.
DERIVED_SLOTS = ("pronoun", "Pronoun", "his", "fpronoun", "fPronoun", "fhis")
CAST_SLOTS = tuple(CAST_DOMAINS) + DERIVED_SLOTS

STORY_PARTS: list[list[str]] = [
    ["Once upon a time, there was a {adj} {animal} named {Name}."],
    ["{Name} lived in {home}.", "{Pronoun} lived with {his} {family} in {home}."],
    ["{Name} loved to {activity}.", "Every day, {pronoun} liked to {activity}."],
    ["One day, {Name} went to {place} to {purpose}.", "One {time}, {Name} took a walk to {place}."],
    ["There, {pronoun} met a {adj} {animal2} named {Friend}.",
     "At {place}, {pronoun} saw a {adj} {animal2} named {Friend}."],
    [
        '{Friend} said, "Hello, {Name}! Do you want to play with me?" {Name} said, "Yes, I would love to!" '
        "{Name} and {Friend} {played} all day.",
        "{Friend} was sad because {fpronoun} lost {fhis} {lost}. "
        '{Name} said, "Do not be sad. I will help you." '
        "They looked everywhere, and soon {Name} found the {lost} under {hiding}. "
        '{Friend} said, "Thank you, {Name}! You are a good friend."',
        "{Friend} was very hungry. {Name} gave {Friend} {snack}. "
        '{Friend} said, "Thank you! You are very kind." {fPronoun} ate it all up.',
    ],
    ["{Name} felt very {feeling}.", "{Name} smiled a big smile."],
    ["They became best friends.", "From that day on, {Name} and {Friend} played together every day.",
     "It was the best day ever."],
    ["The end."],
]

GREETINGS = ["Hello!", "Hi!", "Good morning!", "Hi there!"]
GREETING_ANSWER = "Hello! I can tell you a story, or answer a question about animals and colors."
WHO_QUESTIONS = ["Who are you?", "What is your name?"]
WHO_ANSWER = "I am the Octavo demo model. I know about animals, colors and stories."
THANKS = ["Thank you!", "Thanks!"]
THANKS_ANSWER = "You are welcome!"
STORY_REQUESTS = ["Tell me a story.", "Can you tell me a story?", "Please tell me a story."]
ANIMAL_STORY_REQUESTS = ["Tell me a story about a {animal}.", "Can you tell me a story about a {animal}?"]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You are a friendly storyteller."]

# (question templates, answer template, field of Animal)
ANIMAL_QUESTIONS = [
    (["What does a {animal} say?", "What sound does a {animal} make?"], "A {animal} says {value}.", "sound"),
    (["Where does a {animal} live?"], "A {animal} lives {value}.", "home"),
    (["What does a {animal} eat?", "What does a {animal} like to eat?"], "A {animal} eats {value}.", "food"),
    (["How many legs does a {animal} have?"], "A {animal} has {value} legs.", "legs"),
]
COLOR_QUESTION = "What color is {thing}?"
# A fact question with this suffix is answered as a JSON object, {"answer": ...}
# (compact, as structured outputs write JSON), so that JSON mode has a model to show.
JSON_SUFFIX = " Answer in JSON."

_SLOT = re.compile(r"\{(\w+)\}")


def zipf_choice(rng: random.Random, options: list) -> tuple[object, float]:
    """One option, weight 1/(rank+1); also its -log probability (nats)."""
    weights = [1.0 / (rank + 1) for rank in range(len(options))]
    index = rng.choices(range(len(options)), weights=weights)[0]
    return options[index], -math.log(weights[index] / sum(weights))


@dataclass
class Generated:
    """A text and the information (nats) its random choices carried."""

    text: str
    nats: float = 0.0


@dataclass
class _Filler:
    rng: random.Random
    cast: dict[str, str] = field(default_factory=dict)
    nats: float = 0.0

    def choose(self, options: list):
        value, nats = zipf_choice(self.rng, options)
        self.nats += nats
        return value

    def fill(self, template: str) -> str:
        def value(match: re.Match) -> str:
            slot = match.group(1)
            return self.cast[slot] if slot in self.cast else self.choose(WORDS[slot])

        return _SLOT.sub(value, template)


def derive_pronouns(cast: dict[str, str]) -> None:
    """Add the pronoun slots that follow from the cast's names (in place)."""
    if "Name" in cast:
        cast["pronoun"], cast["Pronoun"], cast["his"] = PRONOUNS[NAMES[cast["Name"]]]
    if "Friend" in cast:
        cast["fpronoun"], cast["fPronoun"], cast["fhis"] = PRONOUNS[NAMES[cast["Friend"]]]


def make_story(rng: random.Random, animal: str | None = None) -> Generated:
    filler = _Filler(rng)
    for slot, domain in CAST_DOMAINS.items():
        if slot == "animal" and animal is not None:
            filler.cast[slot] = animal
            continue
        if slot == "Friend":
            domain = [name for name in domain if name != filler.cast["Name"]]
        filler.cast[slot] = filler.choose(domain)
    derive_pronouns(filler.cast)
    sentences = [filler.fill(filler.choose(alternatives)) for alternatives in STORY_PARTS]
    return Generated(" ".join(sentences), filler.nats)


def answer_for(question: str) -> str | None:
    """The one right answer to a fact question of the grammar; None for others."""
    if question.endswith(JSON_SUFFIX):
        answer = answer_for(question[: -len(JSON_SUFFIX)])
        return None if answer is None else json.dumps({"answer": answer})
    if question in GREETINGS:
        return GREETING_ANSWER
    if question in WHO_QUESTIONS:
        return WHO_ANSWER
    if question in THANKS:
        return THANKS_ANSWER
    for thing, color in COLORS_OF_THINGS.items():
        if question == COLOR_QUESTION.format(thing=thing):
            return f"{thing[0].upper()}{thing[1:]} is {color}."
    for templates, answer, attribute in ANIMAL_QUESTIONS:
        for name, animal in ANIMALS.items():
            if question in (t.format(animal=name) for t in templates):
                return answer.format(animal=name, value=getattr(animal, attribute))
    return None


def make_question(rng: random.Random) -> tuple[str, str | None]:
    """(question, the animal a story must be about or None); stories are about a third of turns."""
    kind = rng.choices(["fact", "color", "story", "animal_story", "small_talk", "json"], weights=[6, 2, 2, 2, 1, 2])[0]
    if kind == "json":
        templates, _, _ = rng.choice(ANIMAL_QUESTIONS)
        return rng.choice(templates).format(animal=rng.choice(list(ANIMALS))) + JSON_SUFFIX, None
    if kind == "fact":
        templates, _, _ = rng.choice(ANIMAL_QUESTIONS)
        return rng.choice(templates).format(animal=rng.choice(list(ANIMALS))), None
    if kind == "color":
        return COLOR_QUESTION.format(thing=rng.choice(list(COLORS_OF_THINGS))), None
    if kind == "story":
        return rng.choice(STORY_REQUESTS), None
    if kind == "animal_story":
        animal = rng.choice(list(ANIMALS))
        return rng.choice(ANIMAL_STORY_REQUESTS).format(animal=animal), animal
    return rng.choice(GREETINGS + WHO_QUESTIONS + THANKS), None


def make_conversation(rng: random.Random) -> list[dict[str, str]]:
    """1-3 user/assistant turns, sometimes after a system prompt."""
    messages: list[dict[str, str]] = []
    if rng.random() < 0.2:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for _ in range(rng.choice([1, 1, 2, 3])):
        question, animal = make_question(rng)
        answer = answer_for(question)
        if answer is None:  # a story request
            answer = make_story(rng, animal).text
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages


# -- parsing -----------------------------------------------------------------


def _alternation(values) -> str:
    return "(?:" + "|".join(re.escape(v) for v in sorted(values, key=len, reverse=True)) + ")"


def _template_regex(template: str, bound: dict[str, str]) -> re.Pattern:
    seen: set[str] = set()
    pieces, last = [], 0
    for match in _SLOT.finditer(template):
        pieces.append(re.escape(template[last : match.start()]))
        slot = match.group(1)
        if slot in bound:
            pieces.append(re.escape(bound[slot]))
        elif slot in seen:
            pieces.append(f"(?P={slot})")
        elif slot in CAST_DOMAINS:
            seen.add(slot)
            pieces.append(f"(?P<{slot}>{_alternation(CAST_DOMAINS[slot])})")
        else:
            pieces.append(_alternation(WORDS[slot]))
        last = match.end()
    pieces.append(re.escape(template[last:]))
    return re.compile("".join(pieces))


@dataclass
class StoryParse:
    """How far a text parses as a story: the parts matched, the cast, and the unparsed rest."""

    num_parts: int
    cast: dict[str, str]
    rest: str

    @property
    def complete(self) -> bool:
        return self.num_parts == len(STORY_PARTS) and not self.rest.strip()


def parse_story(text: str) -> StoryParse:
    """Parse ``text`` part by part; stops at the first part no alternative matches."""
    cast: dict[str, str] = {}
    position = 0
    for index, alternatives in enumerate(STORY_PARTS):
        start = position + (1 if index and text.startswith(" ", position) else 0)
        best = None
        for template in alternatives:
            match = _template_regex(template, cast).match(text, start)
            if match and (best is None or match.end() > best.end()):
                best = match
        if best is None:
            return StoryParse(index, cast, text[position:])
        cast.update({k: v for k, v in best.groupdict().items() if v is not None})
        if cast.get("Friend") is not None and cast.get("Friend") == cast.get("Name"):
            return StoryParse(index, cast, text[position:])
        derive_pronouns(cast)
        position = best.end()
    return StoryParse(len(STORY_PARTS), cast, text[position:])


def vocabulary() -> set[str]:
    """Every word the grammar can produce (lower-cased, punctuation stripped)."""
    texts = [t for part in STORY_PARTS for t in part]
    texts += [v for values in WORDS.values() for v in values] + [v for d in CAST_DOMAINS.values() for v in d]
    texts += [" ".join(PRONOUNS[g]) for g in PRONOUNS] + list(COLORS_OF_THINGS) + list(COLORS_OF_THINGS.values())
    texts += GREETINGS + [GREETING_ANSWER, WHO_ANSWER, THANKS_ANSWER] + WHO_QUESTIONS + THANKS + SYSTEM_PROMPTS
    texts += STORY_REQUESTS + ANIMAL_STORY_REQUESTS + [COLOR_QUESTION, JSON_SUFFIX, "answer"]
    for templates, answer, _ in ANIMAL_QUESTIONS:
        texts += templates + [answer]
    for animal in ANIMALS.values():
        texts += [animal.sound, animal.home, animal.food, animal.legs]
    return {w for text in texts for w in words_of(_SLOT.sub(" ", text))}


def words_of(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())
