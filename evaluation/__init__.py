"""Running the whole pipeline in one process, on simulated time: for tests and evaluations."""
