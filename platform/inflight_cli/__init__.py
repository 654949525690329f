"""`inflight`: the command-line client of an Inflight server, over its JSON API (/api/).

Plain HTTP (httpx) with the API's tokens: no Django, no torch, so it installs and starts fast on
a laptop that only talks to the server. `inflight --help` lists the commands.
"""
