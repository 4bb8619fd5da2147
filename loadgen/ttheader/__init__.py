"""Thrift (ttheader): the reference service, its IDL and the Locust RPC users."""

#: Failures the demo's users cause on purpose (loadgen.demo.expected_failures): (Locust
#: name or None for any, the start of Locust's error text, the proxy's status, why)
DEMO_EXPECTED_FAILURES = (
    ("retired", "", "UNKNOWN_METHOD",
     "the users call `retired`, a method the service does not have, to show an "
     "UNKNOWN_METHOD answer"),
    (None, "NotFound", "EXCEPTION",
     "about 1 % of the user ids the users ask for do not exist: the service answers "
     "its declared NotFound exception"),
)
