"""FlowForge: durable webhook-driven workflows on PostgreSQL and RabbitMQ."""
