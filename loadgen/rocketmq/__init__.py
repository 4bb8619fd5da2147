"""RocketMQ load-generation pieces: the in-memory reference name server + broker."""

#: ``frametap demo --faults`` (loadgen/demo.py): one rule on the route in front of the
#: broker. The RocketMQ users send SEND_MESSAGE_V2 (users.py: FRAMETAP_ROCKETMQ_SEND_V2=1,
#: batch 1), so about 5 % of them get the proxy's SYSTEM_BUSY answer instead of the broker's.
DEMO_FAULT = ("broker", {
    "name": "busy",
    "match": {"opcode": ["SEND_MESSAGE_V2"]},
    "action": {"type": "error", "status": "SYSTEM_BUSY"},
    "trigger": {"probability": 0.05},
})
