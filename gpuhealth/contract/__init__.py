"""The parts of the Kafka contract the library needs too: the types of every message, the training alert."""
