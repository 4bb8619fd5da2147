"""RocketMQ load-generation pieces: the in-memory reference name server + broker."""
