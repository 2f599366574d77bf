"""What travels on Kafka, beyond each topic's model: how its messages are signed and checked."""
