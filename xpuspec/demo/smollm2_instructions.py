"""Instructions for distilling the SmolLM2 draft: templates x topics, made here, nothing downloaded.

Held-out instructions use topics that no training instruction mentions, so the acceptance measured on them
is on questions the draft never saw (their template shapes are shared: that is the product's use).
"""

from __future__ import annotations

import random

TEMPLATES: tuple[str, ...] = (
    "What is {t}?",
    "Explain {t} in simple terms.",
    "Give me three facts about {t}.",
    "Why is {t} important?",
    "Write a short paragraph about {t}.",
    "How would you describe {t} to a child?",
    "What are the main advantages and disadvantages of {t}?",
    "Summarize what you know about {t} in two sentences.",
    "List five questions a student might ask about {t}.",
    "Write a haiku about {t}.",
    "What is a common misconception about {t}?",
    "How does {t} work?",
    "Tell me a short story that involves {t}.",
    "What is the history of {t}?",
    "Compare {t} with something from everyday life.",
    "Write a tweet about {t}.",
    "What should a beginner know about {t}?",
    "Give an example of {t}.",
    "Write a short poem about {t}.",
    "Describe {t} in one sentence.",
    "What are some fun facts about {t}?",
    "Write an email to a friend about {t}.",
    "What are the key ideas behind {t}?",
    "How can I learn more about {t}?",
)

TOPICS: tuple[str, ...] = (
    "photosynthesis",
    "gravity",
    "inflation",
    "a linked list",
    "the water cycle",
    "volcanoes",
    "recursion",
    "democracy",
    "vaccines",
    "black holes",
    "rainbows",
    "compound interest",
    "DNA",
    "the internet",
    "magnets",
    "tides",
    "the French Revolution",
    "machine learning",
    "climate change",
    "the moon",
    "coffee",
    "chess",
    "the Roman Empire",
    "electric cars",
    "honey bees",
    "earthquakes",
    "Python programming",
    "the stock market",
    "sleep",
    "music theory",
    "the human heart",
    "recycling",
    "solar panels",
    "the Pacific Ocean",
    "dinosaurs",
    "friendship",
    "time management",
    "the printing press",
    "bicycles",
    "cloud computing",
    "the immune system",
    "renewable energy",
    "ancient Egypt",
    "the Olympic Games",
    "bread baking",
    "rain forests",
    "sorting algorithms",
    "the speed of light",
    "healthy eating",
    "public speaking",
    "the periodic table",
    "Mars",
    "jazz",
    "the Great Wall of China",
    "electricity",
    "meditation",
    "social media",
    "the Amazon river",
    "penguins",
    "World War II",
    "supply and demand",
    "a binary search",
    "hurricanes",
    "the brain",
    "painting",
    "airplanes",
    "the Renaissance",
    "cats",
    "dogs",
    "the Sahara desert",
    "encryption",
    "exercise",
    "tea",
    "the Eiffel Tower",
    "volunteering",
    "the solar system",
    "mountains",
    "a budget",
    "robots",
    "video games",
    "gardening",
    "libraries",
    "the scientific method",
    "bees and flowers",
    "oceans",
    "trains",
    "the first computers",
    "glaciers",
    "newspapers",
    "smartphones",
    "the Moon landing",
    "soccer",
    "photography",
    "rivers",
    "spiders",
    "the Industrial Revolution",
    "plastic pollution",
    "online privacy",
    "the Milky Way",
    "chocolate",
)

HELDOUT_TOPICS: tuple[str, ...] = (
    "the capital of France",
    "lighthouses",
    "octopuses",
    "the violin",
    "wind turbines",
    "the Nile",
    "origami",
    "submarines",
    "the Silk Road",
    "comets",
    "hash tables",
    "yoga",
)

HELDOUT_TEMPLATES: tuple[str, ...] = (
    "What is {t}?",
    "Explain {t} in simple terms.",
    "Write a short paragraph about {t}.",
    "Give me three facts about {t}.",
)

FIXED_INSTRUCTIONS: tuple[str, ...] = (
    "What is the capital of Italy?",
    "What is the capital of Germany?",
    "What is the capital of Japan?",
    "What is the capital of Spain?",
    "How many days are in a leap year?",
    "Translate 'good morning' into Spanish.",
    "Write a Python function that adds two numbers.",
    "Write a Python function that reverses a string.",
    "What is 12 times 7?",
    "Who wrote Romeo and Juliet?",
    "Give me a recipe for pancakes.",
    "How do I make a cup of tea?",
    "What is the boiling point of water?",
    "Suggest a name for a pet goldfish.",
    "Tell me a joke.",
    "What is the largest planet in the solar system?",
)


def training_instructions(seed: int = 0, limit: int | None = None) -> list[str]:
    """Every template x training topic plus the fixed questions, shuffled; none mentions a held-out topic."""
    items = [template.format(t=topic) for template in TEMPLATES for topic in TOPICS]
    items += list(FIXED_INSTRUCTIONS)
    random.Random(seed).shuffle(items)
    return items[:limit] if limit is not None else items


def heldout_instructions(count: int = 24) -> list[str]:
    """Instructions on topics the training set never mentions, cycling through a few template shapes."""
    items = [
        HELDOUT_TEMPLATES[(index + index // len(HELDOUT_TOPICS)) % len(HELDOUT_TEMPLATES)].format(t=topic)
        for index, topic in enumerate(HELDOUT_TOPICS * len(HELDOUT_TEMPLATES))
    ]
    return items[:count]
