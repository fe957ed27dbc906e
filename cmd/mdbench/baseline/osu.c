/*
 * osu.c: the MPI side of mdbench --baseline. OSU-style point-to-point
 * benchmarks with the same loops, iteration counts and units as mdbench's
 * own, so the two can be compared size by size.
 *
 *   osu lat  SIZE...              half round trip, microseconds
 *   osu bw   WINDOW SIZE...       unidirectional, MB/s (10^6 bytes/s)
 *   osu bibw WINDOW SIZE...       bidirectional, MB/s
 *   osu mr   WINDOW SIZE...       all ranks: pairs (i, i+n/2) stream; messages/s
 *   osu idle SECONDS              rank 1 blocks in MPI_Recv; % of a core it used
 *   osu allreduce SIZE...         all ranks: MPI_Allreduce summing SIZE/8 doubles
 *                                 (at least one)
 *   osu bcast SIZE...             all ranks: MPI_Bcast of SIZE bytes from rank 0
 *   osu barrier 0                 all ranks: MPI_Barrier
 *   osu alltoall SIZE...          all ranks: MPI_Alltoall of SIZE bytes per rank
 *
 * The collectives report microseconds per call: each rank's mean over its
 * timed calls, the largest of those means (see coll).
 *
 * Rank 0 prints one line per size: "<test> <size> <value>". Iteration counts
 * follow lat_iters and bw_iters below, which mdbench mirrors
 * (cmd/mdbench/bench.go), scaled by the environment variable OSU_SCALE.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>

/* OSU_SCALE (mdbench --scale) multiplies every iteration count. */
static double scale = 1;
static long scaled(long n) { long m = (long)(n * scale); return m < 1 ? 1 : m; }
static long lat_iters(long size) { return scaled(size <= 64 ? 50000 : size <= 8192 ? 10000 : size <= 262144 ? 1000 : 200); }
/* As mdbench's bwIters: OSU's 100 windows (20 above 64 KiB), or as many
 * as carry 2^17 messages or 256 MiB, whichever is fewer. */
static long ceil_div(long a, long b) { return (a + b - 1) / b; }
static long bw_iters(long size, long window) {
	long n = size <= 65536 ? 100 : 20;
	long by_msgs = ceil_div(1L << 17, window), by_bytes = ceil_div(256L << 20, size * window);
	long floor = by_msgs < by_bytes ? by_msgs : by_bytes;
	return scaled(n > floor ? n : floor);
}
/* Untimed iterations before n timed ones of per_iter bytes each: as
 * mdbench's warmIters, a tenth of n or as many as carry 2 MiB, up to n. */
static long warm_iters(long n, long per_iter) {
	long w = (2L << 20) / (per_iter > 0 ? per_iter : 1);
	if (w > n) w = n;
	return w > n / 10 + 1 ? w : n / 10 + 1;
}

static char *sbuf, *rbuf;
static MPI_Request *reqs;

static double lat(int rank, long size) {
	long n = lat_iters(size), warm = warm_iters(n, size);
	double t0 = 0;
	for (long i = 0; i < n + warm; i++) {
		if (i == warm) {
			MPI_Barrier(MPI_COMM_WORLD);
			t0 = MPI_Wtime();
		}
		if (rank == 0) {
			MPI_Send(sbuf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
			MPI_Recv(rbuf, size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else if (rank == 1) {
			MPI_Recv(rbuf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			MPI_Send(sbuf, size, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
		}
	}
	return (MPI_Wtime() - t0) * 1e6 / (2.0 * n);
}

/* coll: as mdbench's (cmd/mdbench/collective.go), lat_iters calls of
 * the collective after warm_iters untimed ones, each timed on its own and
 * followed by an untimed MPI_Barrier so that every call starts with the
 * ranks together (barrier itself runs back to back), as osu_allreduce,
 * osu_bcast, osu_alltoall and osu_barrier do. Returns, on rank 0, the
 * largest of the ranks' mean times per call, microseconds. */
static double coll(const char *test, long size, int nranks) {
	int allreduce = strcmp(test, "allreduce") == 0, bcast = strcmp(test, "bcast") == 0;
	int barrier = strcmp(test, "barrier") == 0;
	long elems = size / 8 < 1 ? 1 : size / 8;
	long per_iter = allreduce ? elems * 8 : bcast ? size : barrier ? 0 : size * (nranks - 1);
	long n = lat_iters(size), warm = warm_iters(n, per_iter);
	size_t bytes = allreduce ? elems * sizeof(double) : bcast ? (size_t)size : (size_t)size * nranks;
	char *a = calloc(bytes ? bytes : 1, 1), *b = calloc(bytes ? bytes : 1, 1);
	double total = 0;
	MPI_Barrier(MPI_COMM_WORLD);
	for (long i = 0; i < n + warm; i++) {
		double t0 = MPI_Wtime();
		if (allreduce)
			MPI_Allreduce(a, b, elems, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
		else if (bcast)
			MPI_Bcast(a, size, MPI_CHAR, 0, MPI_COMM_WORLD);
		else if (barrier)
			MPI_Barrier(MPI_COMM_WORLD);
		else
			MPI_Alltoall(a, size, MPI_CHAR, b, size, MPI_CHAR, MPI_COMM_WORLD);
		double t = MPI_Wtime() - t0;
		if (i >= warm)
			total += t;
		if (!barrier)
			MPI_Barrier(MPI_COMM_WORLD);
	}
	double mine = total * 1e6 / n, worst = 0;
	MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
	free(a);
	free(b);
	return worst;
}

/* stream: sender -> receiver, window messages per iteration and an ack. */
static double stream(int rank, int sender, int receiver, long size, int window, int bidir) {
	long n = bw_iters(size, window), warm = warm_iters(n, size * window);
	double t0 = 0;
	for (long i = 0; i < n + warm; i++) {
		if (i == warm) {
			MPI_Barrier(MPI_COMM_WORLD);
			t0 = MPI_Wtime();
		}
		if (rank == sender || (bidir && rank == receiver)) {
			int peer = rank == sender ? receiver : sender;
			int k = 0;
			if (bidir)
				for (int w = 0; w < window; w++)
					MPI_Irecv(rbuf + (size_t)w * size, size, MPI_CHAR, peer, 2, MPI_COMM_WORLD, &reqs[k++]);
			for (int w = 0; w < window; w++)
				MPI_Isend(sbuf, size, MPI_CHAR, peer, 2, MPI_COMM_WORLD, &reqs[k++]);
			MPI_Waitall(k, reqs, MPI_STATUSES_IGNORE);
			if (!bidir)
				MPI_Recv(rbuf, 4, MPI_CHAR, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		} else if (rank == receiver) {
			for (int w = 0; w < window; w++)
				MPI_Irecv(rbuf + (size_t)w * size, size, MPI_CHAR, sender, 2, MPI_COMM_WORLD, &reqs[w]);
			MPI_Waitall(window, reqs, MPI_STATUSES_IGNORE);
			MPI_Send(sbuf, 4, MPI_CHAR, sender, 3, MPI_COMM_WORLD);
		}
	}
	double t = MPI_Wtime() - t0;
	return (double)size * window * n * (bidir ? 2 : 1) / t / 1e6;
}

int main(int argc, char **argv) {
	MPI_Init(&argc, &argv);
	if (getenv("OSU_SCALE"))
		scale = atof(getenv("OSU_SCALE"));
	int rank, nranks;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &nranks);
	if (argc < 3) {
		if (rank == 0)
			fprintf(stderr, "usage: osu lat|allreduce|bcast|alltoall SIZE... | osu barrier 0 | osu bw|bibw|mr WINDOW SIZE... | osu idle SECONDS\n");
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	const char *test = argv[1];
	if (strcmp(test, "idle") == 0) {
		double secs = atof(argv[2]);
		char b[8] = {0};
		double share = 0;
		if (rank == 0) {
			struct timespec ts = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
			nanosleep(&ts, NULL);
			MPI_Send(b, 8, MPI_CHAR, 1, 4, MPI_COMM_WORLD);
			MPI_Recv(&share, 1, MPI_DOUBLE, 1, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			printf("idle 8 %.3f\n", share);
		} else if (rank == 1) {
			struct rusage a, z;
			getrusage(RUSAGE_SELF, &a);
			double t0 = MPI_Wtime();
			MPI_Recv(b, 8, MPI_CHAR, 0, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			double wall = MPI_Wtime() - t0;
			getrusage(RUSAGE_SELF, &z);
			double cpu = (z.ru_utime.tv_sec - a.ru_utime.tv_sec) + (z.ru_stime.tv_sec - a.ru_stime.tv_sec) +
				     ((z.ru_utime.tv_usec - a.ru_utime.tv_usec) + (z.ru_stime.tv_usec - a.ru_stime.tv_usec)) / 1e6;
			share = 100 * cpu / wall;
			MPI_Send(&share, 1, MPI_DOUBLE, 0, 5, MPI_COMM_WORLD);
		}
		MPI_Finalize();
		return 0;
	}
	int collective = strcmp(test, "allreduce") == 0 || strcmp(test, "bcast") == 0 ||
			 strcmp(test, "barrier") == 0 || strcmp(test, "alltoall") == 0;
	int lt = strcmp(test, "lat") == 0 || collective;
	int window = lt ? 1 : atoi(argv[2]);
	if (window < 1) {
		if (rank == 0)
			fprintf(stderr, "osu: window %s: want at least 1\n", argv[2]);
		MPI_Abort(MPI_COMM_WORLD, 2);
	}
	int first = lt ? 2 : 3;
	long maxsize = 4;
	for (int i = first; i < argc; i++)
		if (atol(argv[i]) > maxsize)
			maxsize = atol(argv[i]);
	sbuf = malloc(maxsize);
	rbuf = malloc((size_t)maxsize * (window > 0 ? window : 1));
	reqs = malloc(sizeof(MPI_Request) * 2 * (window > 0 ? window : 1));
	memset(sbuf, 'a', maxsize);
	for (int i = first; i < argc; i++) {
		long size = atol(argv[i]);
		double v;
		if (collective) {
			v = coll(test, size, nranks);
		} else if (lt) {
			v = lat(rank, size);
		} else if (strcmp(test, "bw") == 0) {
			v = stream(rank, 0, 1, size, window, 0);
		} else if (strcmp(test, "bibw") == 0) {
			v = stream(rank, 0, 1, size, window, 1);
		} else if (strcmp(test, "mr") == 0) {
			int pairs = nranks / 2;
			double mine = 0, all = 0;
			if (rank < 2 * pairs)
				mine = stream(rank, rank % pairs, rank % pairs + pairs, size, window, 0);
			/* mine is MB/s of this pair, seen alike by both ends: count senders only */
			if (rank >= pairs)
				mine = 0;
			MPI_Reduce(&mine, &all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
			v = all * 1e6 / size;
		} else {
			if (rank == 0)
				fprintf(stderr, "osu: unknown test %s\n", test);
			MPI_Abort(MPI_COMM_WORLD, 2);
			return 2;
		}
		if (rank == 0)
			printf("%s %ld %.4f\n", test, size, v);
		fflush(stdout);
	}
	MPI_Finalize();
	return 0;
}
