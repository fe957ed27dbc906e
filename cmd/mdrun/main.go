// Command mdrun starts the ranks of a multidevice job, on this host or on
// several.
//
//	mdrun [flags] -n N prog [args...]
//	mdrun -hosts h1:2,h2:2 [-launcher ssh] [-listen addr:port] -n 4 prog [args...]
//	mdrun -hostfile hosts.txt -n 64 prog [args...]
//	mdrun -hosts h1,h2 -ppn 4 -map-by node -x OMP_NUM_THREADS=2 -n 8 prog [args...]
//	mdrun [flags] -n N prog [args...] : -n M prog2 [args...] [: ...]
//
// It runs N copies of prog, each with the environment the bootstrap package
// reads (MDRUN_ADDR, MDRUN_RANK, MDRUN_SIZE, MDRUN_JOBID, MDRUN_SECRET,
// MDRUN_HOST, MD_APPNUM, MD_PLUGINS and MD_CONNTABLE when -plugins and
// -conntable are given or mdrun's environment has them, as absolute
// paths, and MD_SITE on a host given a site), serves their
// rendezvous,
// and forwards their output line by line with a "[rank] " prefix (lines
// over 64 KiB are split, and a last line gets a newline); -prefix=false
// passes it on unchanged instead, binary output included, each piece
// mdrun reads from a rank written whole, so that ranks' lines may mix.
// The ranks' standard input is /dev/null. Each
// rank runs in its own process group, so SIGINT, SIGTERM, SIGHUP and
// SIGQUIT reach it once, passed on by mdrun, together with any process it
// started; a second signal kills the ranks at once.
//
// # Several hosts
//
// -hosts (h1,h2:2,[fd00::3]:4) or -hostfile (one host per line: host,
// host:slots or host slots=N; '#' starts a comment; see Sites below for
// the optional site of each) place the ranks as -map-by says (see
// Placement below): by default each host in turn takes as many
// consecutive ranks as it has slots (1 if not given, or -ppn N's), and
// the list starts over until every rank has a host, as Hydra does. Ranks on "localhost" or on this machine's host name start here;
// the others start through the -launcher command (default ssh), called as
//
//	launcher host cd -- DIR 2>/dev/null; env MDRUN_ADDR=... MD_...=... prog args...
//
// with every word after the host shell text, quoted for a POSIX shell,
// since ssh hands them to the remote shell as one command line. A launcher
// script that is not ssh does the same: `exec ip netns exec NS sh -c "$*"`
// (mpiexec's -launcher-exec takes the same kind of script). The program
// must have the same path on every host. Ranks start in DIR, mdrun's own
// directory, as mpiexec's do; a host without it starts them where the
// launcher does (ssh: the home directory). -wdir DIR names the directory
// instead, and a host without that one fails the rank ("cd -- DIR &&");
// if ranks start here, mdrun checks it here before any rank starts.
// Remote ranks see only the MDRUN_* variables, the MD_* variables of
// mdrun's environment and those named with -x; where mdrun sets a variable
// itself (MD_PLUGINS from -plugins, MD_CONNTABLE from -conntable, MD_SITE,
// MD_APPNUM), its value takes the place of mdrun's own.
//
// -x NAME=VALUE (Open MPI's form) sets NAME to VALUE in the environment
// of every rank, here and on other hosts, in place of mdrun's own; the
// value may hold anything, '=' and spaces included, and is quoted on the
// launcher's command line like every other word. -x NAME passes mdrun's
// own value to remote ranks, as above. Of several -x of one name, the
// last counts (a program's after the job's, see below); a -x NAME for a
// variable mdrun does not have passes nothing. Where mdrun sets the
// variable itself (from a flag, the host's site) its value still wins,
// and a value for one it always sets (MDRUN_RANK and the other variables
// of the bootstrap package, MD_APPNUM) is a usage error. The value is
// passed as written: a relative path in -x MD_PLUGINS=p is not made
// absolute as -plugins p and mdrun's own MD_PLUGINS are.
//
// # Placement
//
// -map-by slot (the default) fills each host's slots with consecutive
// ranks before the next host's, as above (block placement):
//
//	mdrun -hosts a:2,b:1,c:2 -n 5 prog     # a a b c c
//
// -map-by node deals the ranks out round-robin, one per host in turn,
// skipping a host whose slots are full, as mpirun --map-by node does; a
// host listed more than once is one host with the slots of all its
// entries. With more ranks than slots in all, both policies start over as
// if every slot were free again, so each host is oversubscribed in
// proportion to its slots:
//
//	mdrun -hosts a:2,b:1,c:2 -map-by node -n 5 prog     # a b c a c
//	mdrun -hosts a:2,b:1 -map-by node -n 5 prog         # a b a | a b
//
// The ranks of every program of the job are placed as one list; relays
// are not placed by it, but on their own -relay hosts. -ppn N (Hydra's
// processes per node) gives every host of -hosts or -hostfile that names
// no slots of its own N slots; it needs one of them, and a host that
// gives its own slots is a usage error.
//
// The rendezvous service then listens on TCP at -listen, by default on this
// machine's address on the route to the first remote host, any port. It
// admits only ranks that present the job secret; the secret travels on the
// launcher's standard input (MDRUN_SECRET=- on its command line), so other
// users of either host cannot read it with ps. A launcher script must
// therefore pass its standard input on to the rank, as ssh and
// `ip netns exec` do. MDRUN_HOST is the name given in the list,
// so ranks on one host use shared memory and those on different hosts TCP;
// the ranks on this machine, relays included, all get the first of its
// names ("localhost" or its host name) in the list, or its host name if
// the list has none, and its entries must name one site.
//
// Output, exit statuses and signals work as on one host; a failing remote
// rank is named with its host ("rank 3 on h2 (launcher pid 1234)"). A
// signal to the launcher does not reach a remote rank through ssh, so
// mdrun also closes the rendezvous service when the job fails, and remote
// ranks that have not finished end themselves when it closes
// (MDRUN_EXIT_WITH_SERVICE=1).
//
// # Several programs
//
// One job may run several programs (MPMD), coupled codes such as an ocean
// and an atmosphere model, as mpiexec runs them: sections separated by ':'
// words, each after the first with its own -n:
//
//	mdrun -hosts h1:2,h2:3 -n 2 ocean -c o.cfg : -n 3 atmos -v
//
// The ranks share one world and are numbered across the sections in order
// (ocean 0-1, atmos 2-4); -hosts, -hostfile, -map-by, -bind and relays
// place that one list as they place a single program's ranks, and output, exit
// statuses, signals and -timeout cover every program alike, a failing
// rank being named with its program ("rank 3 (atmos, pid 1234)"). Every
// rank gets MD_APPNUM, the index of its section from 0, which MPI calls
// the rank's MPI_APPNUM (go doc adi.World.AppNum); a job of one program
// gets MD_APPNUM=0 too, as MPI does, and relays get none.
//
// The flags before the first program are the job's. A section after ':'
// takes -n M (required), and may take -x NAME and -x NAME=VALUE, adding
// variables for its own ranks to the job's (and, for a name the job's -x
// gave too, in place of that), and -wdir DIR, in place of the job's
// directory for its own ranks; any other flag there is an error. Each
// section's program is looked up before any rank starts, and one that is
// not found is a usage error naming the section. As in Hydra and Open
// MPI, a word that is exactly ':' always separates sections, wherever it
// is: to hand one to a program, put it inside a longer word, e.g. through
// a shell: mdrun -n 2 sh -c 'exec prog a : b'.
//
// # Sites
//
// A job that spans clusters of hosts (joined by gateways, or by a network
// slower than each cluster's own) names each host's cluster, its site:
// "@site" after a -hosts entry, "site=NAME" on a hostfile line, in any
// order with slots=N:
//
//	mdrun -hosts a1:4@A,a2:4@A,b1:4@B,[fd00::7]:4@B -n 16 prog
//
//	# hosts.txt
//	a1 slots=4 site=A
//	b1:4 site=B
//
// Every rank on a host with a site, relays included, gets MD_SITE=site,
// here and on other hosts, and the library's collectives then go by sites
// as well as by hosts (go doc adi.WithSite). A site name is 1 to 255
// letters, digits, '_', '.' or '-'. Hosts with a site and hosts without
// may be mixed: the ranks of the latter are in no site, and mdrun gives
// them no MD_SITE; they see the one of mdrun's environment, if any, as
// any MD_* variable. A host listed twice must name the same site (or
// none) both times.
//
// -relay entries take "@site" too (see Relays below): a relay on a
// cluster's private network needs its site as much as the cluster's
// hosts do. A relay's rank is in its host's site: on a host of -hosts or
// -hostfile, the site given there, which a -relay entry may repeat or
// leave out; naming another is a usage error, as is naming one for this
// machine when the ranks run here without -hosts.
//
// # Binding
//
// -bind core binds each rank to a core of its own before it starts, as
// mpiexec -bind-to core and srun --cpu-bind=cores do: the ranks of a host
// take its cores in rank order (under -map-by node, ranks 0 and 2 of a
// host its first two), each with all its hardware threads, on
// this machine from the CPUs mdrun itself may use (more ranks here than
// those cores is an error), on another host from CPU 0, through taskset
// (util-linux) in the launcher's command line. Which CPUs share a core
// comes from /sys/devices/system/cpu, here and on the other host. -bind
// hwthread binds each rank to one CPU, the k-th rank of a host to its
// k-th CPU. A rank's Go runtime then has a processor per CPU of its core
// from the start, and the library, seeing each rank alone on its core,
// polls without yielding it.
// Without -bind (or -bind none) ranks are not bound, as under Hydra.
//
// # Relays
//
// -relay h1,h2 (or h1:2 for two on one host, h1@A for one in site A: the
// form of -hosts) adds dedicated relays, as GridMPI puts relays on
// clusters' front-end hosts: each runs -relay-cmd
// (default mdrelay, found next to mdrun or in PATH) on its host as one of
// the job's last ranks, after the N ranks of prog. Relays take no rank in
// the application's world; they forward between ranks that have no direct
// link (found automatically, or "via" the relay's host in a connection
// table), and several relays between two clusters share the traffic. They
// exit when the job's ranks finish; a relay that fails ends the job like
// any rank.
//
//	mdrun -hosts a1:4,b1:4 -relay gw1,gw2 -n 8 prog
//
// Clusters that number their private networks alike (both 10.0.0.0/24)
// and share no other network need every host's site, relays' included:
// without them tcp cannot tell whose 10.0.0.x is whose, and uses the
// network between no two hosts.
//
//	mdrun -hosts a1:4@A,b1:4@B -relay gw1@A,gw2@B -n 8 prog
//
// # Exit status
//
// The job ends when every rank has exited, or as soon as one rank fails:
// exits non-zero, is killed by a signal, panics, calls Abort, or exits 0
// after joining the job (Init) without Finalize, which the others cannot
// finish without. mdrun then names that rank, sends the others SIGTERM
// and, after a grace period,
// SIGKILL; what ranks started, also ranks that have exited, gets both
// too, and mdrun waits for the grace period while any of it is left (a
// job ended by a signal or -timeout likewise). A job whose ranks all
// exit 0 leaves what they started alone, as mpirun does. A rank that exits 0 without joining the job (it never
// called Init) does not fail it, but the other ranks' next fence (in Init
// or Finalize) then fails naming it, instead of waiting for it.
//
// A rank that fails because another left the job before it (a peer's
// ErrPeerDown, a fence that cannot complete) is not the one named: each
// rank tells the rendezvous service which ranks it lost before it can
// fail for them, and mdrun names the rank the failing one lost (and, if
// that one failed after losing another, that other), once the service has
// seen it go, with its own exit status once it has exited, and then the
// failure that followed ("mdrun: after rank 3 left the job, rank 0 (pid
// 1234) exited with status 1"). It waits up to two seconds for the
// connections of the ranks concerned to end: a rank reported lost that is
// still connected was cut off, not dead, and the failing rank is named.
// A rank that lost none is charged to the first rank the service saw
// leave without finalizing, if any.
// Its exit status is:
//
//	0        every rank exited 0
//	N        the first failing rank exited with status N, or aborted with code N
//	         (an abort code outside 1..255 becomes 1; 1 for a rank that
//	         exited 0 without Finalize)
//	128+S    the first failing rank was killed by signal S, or mdrun itself
//	         received signal S; 141 (SIGPIPE) when mdrun's standard output
//	         was closed (mdrun ... | head), which ends the job
//	124      the job ran longer than -timeout
//	2        usage error: bad flags, no program, program not found
//	1        mdrun could not run the job (rendezvous service, starting a rank)
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 2)
	// A closed terminal (SIGHUP) or Ctrl-\ (SIGQUIT) reaches mdrun alone,
	// the ranks being in process groups of their own: by their default
	// action mdrun would die, and Pdeathsig end only the rank processes,
	// orphaning what they started.
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	// Caught rather than ignored, so that a write to a closed stdout
	// (mdrun ... | head) fails with EPIPE instead of killing mdrun before
	// it ended the job, and the ranks still start with SIGPIPE's default
	// (an ignored signal would stay ignored in them).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, sigs))
}
