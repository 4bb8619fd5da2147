"""fleximq load generation: the reference broker, a sync client, Locust users."""
