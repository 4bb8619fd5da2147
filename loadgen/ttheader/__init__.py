"""Thrift (ttheader): the reference service, its IDL and the Locust RPC users."""
