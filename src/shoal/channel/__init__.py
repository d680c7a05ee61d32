"""The control channel to a team's leader: the request and reply types (protocol) and the
client side that sends them (client)."""
