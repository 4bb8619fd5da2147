"""RabbitMQ Stream load-generation pieces: the in-memory reference broker."""
