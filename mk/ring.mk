# engine/serve/ring_server.c (the engine's IO side) runs a libevent loop: everything linking the
# library may pull it in.
LDLIBS += -levent_core
