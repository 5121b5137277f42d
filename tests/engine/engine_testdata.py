"""Prompts shared by the engine tests."""

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):",
    "The three primary colors are",
    "Photosynthesis is the process by which green plants and some other organisms use sunlight to "
    "synthesize foods from carbon dioxide and water. In plants, photosynthesis generally involves "
    "the green pigment chlorophyll and generates oxygen as a byproduct. Explain this to a child:",
]
MAX_TOKENS = 20
