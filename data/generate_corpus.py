#!/usr/bin/env python3
"""Writes data/corpus.txt: English-like fables made from templates, for training the tiny GPT in tests and demos.

Deterministic: the same script gives the same bytes on any Python 3 (it draws only from random.Random.random(), whose
Mersenne Twister sequence is fixed for a given seed). Written for twin; public domain (CC0), like its output.

    python3 data/generate_corpus.py [--bytes 1000000] [--seed 2024] [--out data/corpus.txt]
"""
import argparse
import random

ANIMALS = ["fox", "crow", "hare", "tortoise", "wolf", "lamb", "lion", "mouse", "owl", "goat", "horse", "donkey",
           "cat", "dog", "frog", "stork", "ant", "grasshopper", "bear", "deer", "heron", "sparrow", "goose", "pig",
           "rabbit", "badger", "otter", "swan", "bee", "spider"]
PEOPLE = ["miller", "shepherd", "farmer", "fisherman", "weaver", "baker", "woodcutter", "merchant", "tailor", "smith",
          "king", "queen", "soldier", "sailor", "gardener", "potter", "widow", "traveller", "carpenter", "beggar"]
NAMES = ["Tom", "Anna", "Peter", "Mary", "John", "Martha", "Hugh", "Alice", "Walter", "Edith", "Simon", "Rose",
         "Oliver", "Grace", "Robin", "Clara", "Arthur", "Lucy", "Henry", "Ellen"]
ADJECTIVES = ["old", "young", "clever", "foolish", "proud", "humble", "hungry", "lazy", "patient", "greedy", "kind",
              "quiet", "brave", "timid", "wise", "vain", "honest", "cunning", "gentle", "restless", "tired", "cheerful",
              "jealous", "careful", "stubborn", "generous", "curious", "lonely", "busy", "sleepy"]
PLACES = ["the river", "the old mill", "the forest", "the market", "the hill", "the meadow", "the village well",
          "the castle gate", "the harbour", "the orchard", "the marsh", "the bridge", "the barn", "the garden",
          "the edge of the wood", "the crossroads", "the valley", "the shore", "the farmyard", "the mountain path"]
OBJECTS = ["a piece of cheese", "a golden apple", "a jar of honey", "a loaf of bread", "a silver coin",
           "a basket of eggs", "a bundle of sticks", "a lantern", "a pair of boots", "a fishing net", "a bell",
           "a sack of grain", "a ripe pear", "a cup of milk", "a key", "a feather", "a ring", "a rope", "a map",
           "a wooden box"]
TIMES = ["One morning", "Late one evening", "On a cold winter day", "In the heat of summer", "Long ago",
         "At the first light of dawn", "When the harvest was over", "One rainy afternoon", "Before the market opened",
         "On the night of the full moon", "Early in the spring", "After a long journey"]
WEATHER = ["The wind blew hard from the north", "The sun was warm on the fields", "A thin rain was falling",
           "Snow lay deep on the ground", "The sky was clear and bright", "A grey fog hung over the water",
           "The air smelled of fresh hay", "Thunder rolled far away"]
VERBS_PAST = ["found", "carried", "hid", "lost", "wanted", "stole", "shared", "guarded", "dropped", "sold",
              "mended", "buried", "noticed", "counted", "offered", "refused", "forgot", "discovered"]
MOTIONS = ["walked", "ran", "hurried", "crept", "wandered", "flew", "hopped", "limped", "marched", "strolled"]
FEELINGS = ["glad", "angry", "afraid", "ashamed", "surprised", "sad", "pleased", "worried", "amazed", "sorry"]
SAYINGS = [
    "Slow and steady wins the race", "Do not count your chickens before they are hatched",
    "A friend in need is a friend indeed", "Pride goes before a fall", "Look before you leap",
    "Honesty is the best policy", "Little by little does the trick", "Better safe than sorry",
    "Every cloud has a silver lining", "Actions speak louder than words", "Kindness is never wasted",
    "Those who work hard will not go hungry", "It is easy to be brave from a safe distance",
    "Greed often loses what it has", "A small gift given with love is worth much",
    "Do not trust flatterers", "Necessity is the mother of invention", "United we stand, divided we fall",
]
QUESTIONS = ["Where are you going in such a hurry?", "Why do you look so sad today?", "What have you got there?",
             "Will you share it with me?", "Have you seen my little ones?", "Can you help me cross the river?",
             "Is it true what they say in the village?", "Why should I believe you?", "How far is it to the town?",
             "Who told you that?"]
ANSWERS = ["I am going to the market to sell what I have.", "I have lost my way and the night is coming.",
           "Nothing that would interest you, my friend.", "Only if you promise to help me tomorrow.",
           "They ran off when the storm began.", "I will help you, but you must be careful.",
           "Every word of it is true, and more besides.", "Because I have never told you a lie.",
           "It is not far, if you keep to the road.", "A little bird told me, as little birds do."]
NUMBERS = ["two", "three", "four", "five", "seven", "ten", "twelve", "a hundred"]


class Writer:
    def __init__(self, seed):
        self.rng = random.Random(seed)

    def pick(self, items):
        return items[int(self.rng.random() * len(items)) % len(items)]

    def chance(self, p):
        return self.rng.random() < p

    def character(self):
        if self.chance(0.6):
            return "the " + self.pick(ADJECTIVES) + " " + self.pick(ANIMALS)
        if self.chance(0.5):
            return self.pick(NAMES) + " the " + self.pick(PEOPLE)
        return "a " + self.pick(ADJECTIVES) + " " + self.pick(PEOPLE)

    def sentence(self, hero, other):
        kind = int(self.rng.random() * 9)
        if kind == 0:
            return f"{self.pick(TIMES)}, {hero} {self.pick(MOTIONS)} to {self.pick(PLACES)}."
        if kind == 1:
            return f"There {hero} {self.pick(VERBS_PAST)} {self.pick(OBJECTS)}, and was very {self.pick(FEELINGS)}."
        if kind == 2:
            return f"{self.pick(WEATHER)}, and {hero} thought of {self.pick(OBJECTS)} left at {self.pick(PLACES)}."
        if kind == 3:
            return f'"{self.pick(QUESTIONS)}" asked {other}.'
        if kind == 4:
            return f'"{self.pick(ANSWERS)[:-1]}," said {hero}.'
        if kind == 5:
            return (f"For {self.pick(NUMBERS)} days {hero} {self.pick(VERBS_PAST)} nothing at all, "
                    f"while {other} {self.pick(MOTIONS)} up and down {self.pick(PLACES)}.")
        if kind == 6:
            return f"When {other} saw this, it was {self.pick(FEELINGS)} and said nothing."
        if kind == 7:
            return (f"But {hero} was too {self.pick(ADJECTIVES)} to listen, and soon "
                    f"{self.pick(VERBS_PAST)} {self.pick(OBJECTS)} near {self.pick(PLACES)}.")
        return f"So {hero} and {other} {self.pick(MOTIONS)} together as far as {self.pick(PLACES)}."

    def story(self):
        hero, other = self.character(), self.character()
        thing = self.pick(OBJECTS).split(" ", 1)[1]
        title = f"The {self.pick(ADJECTIVES).capitalize()} {self.pick(ANIMALS).capitalize()} and the {thing.capitalize()}"
        paragraphs = []
        for _ in range(2 + int(self.rng.random() * 4)):
            sentences = [self.sentence(hero, other) for _ in range(3 + int(self.rng.random() * 4))]
            paragraphs.append(" ".join(s[0].upper() + s[1:] for s in sentences))
        moral = f"Moral: {self.pick(SAYINGS)}."
        return title + "\n\n" + "\n\n".join(paragraphs) + "\n\n" + moral + "\n\n\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=1_000_000, help="stop after this many bytes (default 1000000)")
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--out", default="data/corpus.txt")
    args = parser.parse_args()
    writer = Writer(args.seed)
    parts, size = [], 0
    while size < args.bytes:
        story = writer.story()
        parts.append(story)
        size += len(story.encode("ascii"))
    with open(args.out, "w", encoding="ascii", newline="\n") as out:
        out.write("".join(parts))


if __name__ == "__main__":
    main()
