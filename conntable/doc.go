// Package conntable holds the connection table: for each peer and each
// message-size class, the ordered routes a message may take. A route names a
// subdevice and, for indirect communication, the host or rank that forwards.
//
// Tables come from three places: [Derive] builds one on the fly from the
// loaded subdevices (same host: the most exclusive subdevice, shm; other
// hosts: the most exclusive network subdevice, tcp); a user writes one by
// hand to force routes (tcp between local ranks, shm for small and tcp for
// large messages); and mdconfig generates one per host from a network
// description. All three share the JSON file format below, read with [Parse]
// and written with [Table.Encode].
//
// # File format
//
//	{
//	  "version": 1,
//	  "host": "a01",                      // the host this table is for; "" for any
//	  "classes": [                        // ascending; the last has no max_bytes
//	    {"name": "small",  "max_bytes": 1024},
//	    {"name": "medium", "max_bytes": 131072},
//	    {"name": "large"}
//	  ],
//	  "peers": [
//	    {"to": "@local",  "routes": {"*": [{"subdevice": "shm"}]}},
//	    {"to": "@remote", "routes": {"*": [{"subdevice": "tcp"}]}},
//	    {"to": "b07", "routes": {
//	        "small": [{"subdevice": "tcp", "via": "gw1", "cost": 42.5}],
//	        "*":     [{"subdevice": "tcp", "via": "gw1"}]}}
//	  ]
//	}
//
// A peer selector ("to") is, from most to least specific: "rank:N" (one
// rank), a host name (every rank on that host), "@local" (ranks on this
// table's host), "@remote" (ranks on other hosts), "*" (everyone). The most
// specific selector that names a peer wins. Within an entry, routes are keyed
// by class name; "*" covers the classes the entry does not name. Each list is
// ordered by preference: a direct route (no "via") is used alone, and the
// later ones only where it cannot connect; routes through gateways are
// trunks that share the traffic. An entry with "failover": true makes every
// route of its lists, direct or not, a trunk: messages spread over the live
// ones, each is kept until the peer acknowledges it, and one whose route
// fails goes again over another, so a link that dies loses nothing; a
// route with "standby": true in such a list carries nothing while a route
// of the list not on standby lives (a slow network kept as a spare). "via"
// names the next hop (a host or "rank:N"); "cost" is informational
// (mdconfig writes its path cost there).
//
// A [Table] is a plain value; [Table.Resolve] compiles it for one rank of a
// job into a [Resolved] table whose lookups cost a slice index and a short
// scan of the class bounds. Nothing here does I/O except [Load] and
// [Table.Save].
package conntable
