#!/bin/sh
# slurm-one-node.sh start|stop DIR
#
# Starts (or stops) a private one-node Slurm cluster whose every file lives
# in DIR: a munged on its own socket, a slurmctld and a slurmd on this host,
# both running as root, with a node of 4 CPUs whatever the hardware has
# (SlurmdParameters=config_overrides), so `srun -n 4` fits on a small
# machine. It leaves the system's own munge and Slurm alone.
#
#	sudo sh slurm-one-node.sh start /tmp/slurm
#	SLURM_CONF=/tmp/slurm/slurm.conf srun --mpi=pmi2 -n 4 ./ordercheck
#	sudo sh slurm-one-node.sh stop /tmp/slurm
#
# Needs Debian's slurm-wlm and munge (apt-get install slurm-wlm munge) and
# root. The ports are SLURMCTLD_PORT and SLURMD_PORT (default 46817 and
# 46818). start waits up to 20 s for the node to become idle and exits 1
# with the daemons' logs if it does not; stop kills the daemons it started,
# by the pids in DIR.
set -eu

cmd=${1:?usage: slurm-one-node.sh start|stop DIR}
dir=${2:?usage: slurm-one-node.sh start|stop DIR}

stop() {
	# Steps still running (a test that gave up on a hung job) would leave
	# their slurmstepd behind the daemons.
	if [ -s "$dir/slurmctld.pid" ]; then
		SLURM_CONF="$dir/slurm.conf" scancel --partition=md 2>/dev/null && sleep 1 || true
	fi
	for d in slurmd slurmctld munged; do
		if [ -s "$dir/$d.pid" ]; then
			kill "$(cat "$dir/$d.pid")" 2>/dev/null || true
			rm -f "$dir/$d.pid"
		fi
	done
}

case $cmd in
stop)
	stop
	exit 0
	;;
start) ;;
*)
	echo "slurm-one-node.sh: unknown command $cmd" >&2
	exit 2
	;;
esac

for prog in munged slurmctld slurmd sinfo; do
	command -v $prog >/dev/null || { echo "slurm-one-node.sh: $prog not found (apt-get install slurm-wlm munge)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "slurm-one-node.sh: must run as root" >&2; exit 1; }

mkdir -p "$dir/state" "$dir/spool"
chmod 755 "$dir"
# munged wants a key only its user can read.
if [ -r /etc/munge/munge.key ]; then
	cp /etc/munge/munge.key "$dir/munge.key"
else
	dd if=/dev/urandom of="$dir/munge.key" bs=128 count=1 2>/dev/null
fi
chown root:root "$dir/munge.key"
chmod 600 "$dir/munge.key"
munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" \
	--pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"

host=$(hostname)
cat >"$dir/slurm.conf" <<EOF
ClusterName=mdtest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
SlurmctldPort=${SLURMCTLD_PORT:-46817}
SlurmdPort=${SLURMD_PORT:-46818}
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=md Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$dir/slurm.conf"
# -i: ignore state a previous cluster left in DIR.
slurmctld -i
slurmd

i=0
while [ $i -lt 40 ]; do
	if [ "$(sinfo -h -o %t 2>/dev/null)" = idle ]; then
		echo "SLURM_CONF=$SLURM_CONF"
		exit 0
	fi
	sleep 0.5
	i=$((i + 1))
done
echo "slurm-one-node.sh: the node did not become idle within 20 s" >&2
tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
exit 1
