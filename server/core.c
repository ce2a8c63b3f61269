/* The state server core (see core.h). */
