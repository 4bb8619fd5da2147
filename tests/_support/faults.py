"""Fault rules and toxics for the engine's tests, built from proxy.faultspec's own classes
(the validated model the config file and the API produce), with a FaultSet whose whole
rule or toxic list a test can swap at once under live connections."""

import ipaddress

from proxy import faultspec

__all__ = ["FaultSet", "Rule", "Toxic"]


def Rule(name, action, peer=None, **kw):
    """faultspec.Rule with the action first and ``peer`` given as CIDR text."""
    return faultspec.Rule(name, action=action, **kw,
                          peer=ipaddress.ip_network(peer) if peer is not None else None)


def Toxic(name, type, stream="downstream", toxicity=1.0, **attributes):
    """faultspec.Toxic with Toxiproxy's attributes as keywords."""
    return faultspec.Toxic(name, type, stream, toxicity, attributes)


class FaultSet(faultspec.FaultSet):
    """faultspec.FaultSet plus ``set(rules=, toxics=)``: replace a whole list and notify
    the subscribers once, as one API call changing one rule does."""

    def __init__(self, rules=(), toxics=(), protocol="flymq"):
        super().__init__(protocol, rules, toxics)

    def set(self, rules=None, toxics=None):
        if rules is not None:
            self._rules = list(rules)
        if toxics is not None:
            self._toxics = list(toxics)
        self._changed()
