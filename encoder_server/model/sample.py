"""The built-in sample of texts, short and long, plain and noisy: what the int8 check compares int8
with fp32 on (quantization_check), what smoothing calibrates the int8 graph on (smoothing), and
where the int8 and uint8 output ranges come from (outputs.calibration_ranges). A module of its own so
that a process that needs only the texts (the supervisor, through the worker's module) does not
load the model's code with them."""
SAMPLE = [
    "Hello world.",
    "The cat sat on the mat.",
    "How do I reset my password?",
    "Stock markets fell sharply on Monday after the central bank raised interest rates.",
    "A quick brown fox jumps over the lazy dog near the river bank at sunset.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "I absolutely loved this movie; the acting was superb and the plot kept me guessing.",
    "Terrible service, cold food, and we waited an hour for a table.",
    "The function returns None when the key is missing from the dictionary.",
    "Quantum computers use qubits, which can represent zero and one at the same time.",
    "Please remember to bring your passport and two printed copies of the booking.",
    "She plays the violin in the city orchestra every Saturday evening.",
    "What is the capital of Australia?",
    "Canberra is the capital city of Australia, not Sydney as many people think.",
    "Error 404: the page you are looking for could not be found on this server.",
    "Mix the flour, sugar and butter, then bake for twenty minutes at 180 degrees.",
    "The committee will review all applications and announce the results next month.",
    "Machine learning models can inherit biases present in their training data.",
    "ok",
    "Why is the sky blue during the day but red at sunset?",
    " ".join(["The history of the region is long and complicated, shaped by trade, migration, war and "
              "the slow growth of cities along the great rivers that cross its plains."] * 4),
    " ".join(["Customer reviews mention long battery life, a bright screen and a keyboard that feels "
              "solid, though several people found the speakers weak and the charger slow."] * 3),
]
