"""How stampede speaks to Redis, without doing any I/O itself: the Lua scripts
and each one's arguments and replies, URLs and the clients made from them,
client kinds and standby replicas, cluster nodes, and redis-py's errors in
stampede's words. The drivers (``stampede/_async/``) send and receive."""
