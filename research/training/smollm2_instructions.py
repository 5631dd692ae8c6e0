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


# The extended set: more shapes and topics, crossed with the first set's (every pairing not already in it).
MORE_TEMPLATES: tuple[str, ...] = (
    "Can you explain {t} to me?",
    "What are three interesting things about {t}?",
    "Write a limerick about {t}.",
    "What would happen if {t} disappeared?",
    "Give me a step-by-step explanation of {t}.",
    "What are the pros and cons of {t}?",
    "Write a short dialogue between two friends about {t}.",
    "What is the future of {t}?",
    "Explain {t} to a high school student.",
    "Write a blog post introduction about {t}.",
    "What are some myths about {t}?",
    "Why do people care about {t}?",
    "Write a short speech about {t}.",
    "How has {t} changed over time?",
    "What is the most surprising fact about {t}?",
    "Write a riddle about {t}.",
    "Describe {t} using an analogy.",
    "What careers are related to {t}?",
    "Write a product description inspired by {t}.",
    "Summarize {t} in three bullet points.",
)

# fmt: off
MORE_TOPICS: tuple[str, ...] = (
    "quantum computing", "the Pythagorean theorem", "bird migration", "coral reefs", "the stock exchange",
    "electric guitars", "the human skeleton", "earth's atmosphere", "fossils", "cheese making",
    "a neural network", "the Cold War", "ancient Greece", "tornadoes", "wolves", "the ozone layer",
    "blockchain", "the Mona Lisa", "basketball", "the Arctic", "honey", "bamboo", "sharks", "elephants",
    "the metric system", "prime numbers", "fractions", "the Internet of Things", "a compiler",
    "operating systems", "databases", "the Linux kernel", "version control", "unit testing",
    "object-oriented programming", "JavaScript", "the C programming language", "regular expressions",
    "a web browser", "email", "passwords", "artificial intelligence", "virtual reality", "3D printing",
    "nuclear energy", "batteries", "semiconductors", "the periodic law", "acids and bases", "evolution",
    "cells", "bacteria", "viruses", "the digestive system", "the nervous system", "nutrition", "running",
    "swimming", "tennis", "mountain climbing", "camping", "knitting", "pottery",
    "sculpture", "opera", "hip hop", "the piano", "drums", "movies", "theater", "poetry", "novels",
    "Shakespeare", "Greek mythology", "the Vikings", "the Aztecs", "the Ming dynasty", "the Cold War era",
    "the United Nations", "taxes", "banks", "credit cards", "startups", "marketing", "teamwork",
    "leadership", "negotiation", "job interviews", "writing a resume", "learning a language", "grammar",
    "the English alphabet", "maps", "compasses", "clocks", "calendars", "the seasons", "snow", "clouds",
    "lightning", "deserts", "forests", "lakes", "islands", "caves", "bridges", "skyscrapers", "roads",
    "cars", "ships", "rockets", "satellites", "telescopes", "microscopes", "the Sun", "Jupiter", "Saturn",
    "stars", "galaxies", "the Big Bang", "time zones", "coffee shops", "pizza", "rice", "apples", "sugar",
    "salt", "water", "plastic", "paper", "glass", "steel", "wood", "cotton", "wool", "kindness", "patience",
    "curiosity", "happiness", "stress", "habits", "goals", "parenting", "pets", "horses", "owls", "frogs",
    "butterflies", "ants", "trees", "flowers", "mushrooms", "seeds",
)
# fmt: on

MORE_FIXED: tuple[str, ...] = (
    "Write a Python function that checks whether a number is prime.",
    "Write a Python function that returns the factorial of n.",
    "Write a Python function that computes the Fibonacci numbers.",
    "Write a Python function that counts the vowels in a string.",
    "Write a Python function that finds the largest number in a list.",
    "Write a Python function that sorts a list of names.",
    "Write a Python script that reads a file and prints each line.",
    "Write a JavaScript function that adds two numbers.",
    "Write a SQL query that selects all users older than 30.",
    "Explain what a for loop does in Python.",
    "What is the difference between a list and a tuple in Python?",
    "How do I install a Python package?",
    "What is 15 plus 27?",
    "What is 9 times 8?",
    "What is the square root of 144?",
    "How many minutes are in a day?",
    "Convert 100 degrees Fahrenheit to Celsius.",
    "What is the capital of Canada?",
    "What is the capital of Australia?",
    "What is the capital of Brazil?",
    "What is the capital of Egypt?",
    "What is the tallest mountain in the world?",
    "Who painted the Starry Night?",
    "Who invented the telephone?",
    "Who was Albert Einstein?",
    "Who was the first person on the Moon?",
    "Give me five tips for better sleep.",
    "Give me a packing list for a beach holiday.",
    "Plan a one-day trip to a big city.",
    "Suggest three books for a long flight.",
    "Write a thank-you note to a teacher.",
    "Write a birthday message for my sister.",
    "Write a short motivational quote.",
    "How do I boil an egg?",
    "How do I change a flat tire?",
    "How can I save money each month?",
    "What are good habits for students?",
    "Tell me a fun fact about animals.",
    "Tell me a riddle and its answer.",
    "Translate 'thank you' into French.",
    "Translate 'hello, how are you?' into German.",
    "What is the opposite of 'ancient'?",
    "Give me a synonym for 'happy'.",
    "Correct the grammar: 'She go to school every days.'",
    "Rewrite this sentence more formally: 'Gonna grab some food, brb.'",
    "Summarize the plot of Cinderella.",
    "What is the difference between weather and climate?",
    "Why is the sky blue?",
    "Why do leaves change color in autumn?",
    "How do airplanes stay in the air?",
)


def _extended_instructions(seed: int) -> list[str]:
    first = {template.format(t=topic) for template in TEMPLATES for topic in TOPICS}
    items = [
        template.format(t=topic)
        for template in TEMPLATES + MORE_TEMPLATES
        for topic in TOPICS + MORE_TOPICS
        if template.format(t=topic) not in first
    ]
    random.Random(seed + 1).shuffle(items)
    return list(MORE_FIXED) + items


def training_instructions(seed: int = 0, limit: int | None = None, *, extended: bool = True) -> list[str]:
    """Every template x training topic plus the fixed questions, shuffled; none mentions a held-out topic.

    With ``extended``, the extended set follows (its own order), so the first set's order - and so what a
    cut run answered first - does not change when the extended set does.
    """
    items = [template.format(t=topic) for template in TEMPLATES for topic in TOPICS]
    items += list(FIXED_INSTRUCTIONS)
    random.Random(seed).shuffle(items)
    if extended:
        items += _extended_instructions(seed)
    return items[:limit] if limit is not None else items


def heldout_instructions(count: int = 24) -> list[str]:
    """Instructions on topics the training set never mentions, cycling through a few template shapes."""
    items = [
        HELDOUT_TEMPLATES[(index + index // len(HELDOUT_TOPICS)) % len(HELDOUT_TEMPLATES)].format(t=topic)
        for index, topic in enumerate(HELDOUT_TOPICS * len(HELDOUT_TEMPLATES))
    ]
    return items[:count]
