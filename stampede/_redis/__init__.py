"""What speaks Redis: the Lua scripts, URLs and the clients made from them, and
cluster nodes."""
