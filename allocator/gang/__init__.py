"""Gang scheduling: PodGroups and Koordinator gangs placed all-or-nothing behind a scheduling gate."""
