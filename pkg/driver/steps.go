package driver

// Step names a point in Prepare or Unprepare between two changes to the disk. Deps.AtStep is
// called at each: the crash tests (test/integration, crash_test.go) SIGKILL the plugin there
// and check that start-up leaves a consistent disk and checkpoint. Production sets no hook.
type Step string

// The steps, in the order they are passed.
const (
	// StepPrepareAdmitted: the claim passed the capacity check; nothing of it is on disk.
	StepPrepareAdmitted Step = "prepare-admitted"
	// StepPrepareMIG: a partition's MIG instance exists (on a MIG-managed GPU); no record
	// names it, nothing else of the claim is on disk.
	StepPrepareMIG Step = "prepare-mig"
	// StepPrepareClaimDir: the claim directory (its tmpfs, its per-claim directories) exists;
	// no CDI spec; the checkpoint record is being written at the same time, and may be durable.
	StepPrepareClaimDir Step = "prepare-claim-dir"
	// StepPrepareCDISpec: the CDI spec exists too; the record may be durable.
	StepPrepareCDISpec Step = "prepare-cdi-spec"
	// StepPrepareRecorded: the files exist and the checkpoint record is durable; the kubelet has
	// no answer yet.
	StepPrepareRecorded Step = "prepare-recorded"
	// StepUnprepareCDISpec: the CDI spec is removed; the record and the directory remain.
	StepUnprepareCDISpec Step = "unprepare-cdi-spec"
	// StepUnprepareMIG: the instances of the claim's partitions that no other claim holds are
	// destroyed; the record remains (start-up makes them again, the kubelet's retry destroys
	// them).
	StepUnprepareMIG Step = "unprepare-mig"
	// StepUnprepareRemoved: the record is removed in memory and not yet on disk
	// (RemoveDeferred); the directory remains; the kubelet is about to be answered.
	StepUnprepareRemoved Step = "unprepare-removed"
	// StepUnprepareClaimDir: after the answer, in the background: the claim directory is
	// removed; the record's removal may not be on disk yet.
	StepUnprepareClaimDir Step = "unprepare-claim-dir"
)

// Steps lists every step, for the tests that walk them all.
var Steps = []Step{
	StepPrepareAdmitted, StepPrepareMIG, StepPrepareClaimDir, StepPrepareCDISpec, StepPrepareRecorded,
	StepUnprepareCDISpec, StepUnprepareMIG, StepUnprepareRemoved, StepUnprepareClaimDir,
}

// at calls the step hook, if any.
func (d *Driver) at(s Step) {
	if d.deps.AtStep != nil {
		d.deps.AtStep(s)
	}
}
