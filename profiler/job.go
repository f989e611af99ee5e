package profiler

// job is a background task of the profiler (naming stacks, reading Python
// frames, reading new processes, delivering out-of-memory snapshots), run
// on a goroutine of its own and never on its callers': so one run is under
// way at a time without a lock to say so, and a reader that needs it done
// (a snapshot, Sync) asks and waits for the acknowledgement.
type job struct {
	run     func()
	asked   chan struct{}      // a run nobody waits for; one pending at most
	waiting chan chan struct{} // runs waited for: closed once done
	stopped <-chan struct{}
}

func newJob(run func(), stopped <-chan struct{}) *job {
	return &job{run: run, asked: make(chan struct{}, 1), waiting: make(chan chan struct{}), stopped: stopped}
}

// ask has the job run soon, unless a run is pending already.
func (j *job) ask() { signal(j.asked) }

// await returns once a run that began after the call is done. Once the
// profiler is closed, it returns at once: nothing runs then.
func (j *job) await() {
	done := make(chan struct{})
	select {
	case j.waiting <- done:
	case <-j.stopped:
		return
	}
	select {
	case <-done:
	case <-j.stopped:
	}
}

// loop runs the job as it is asked for, until stopped. Every request that
// came before a run began is answered by that run.
func (j *job) loop() {
	for {
		var answers []chan struct{}
		select {
		case <-j.stopped:
			return
		case <-j.asked:
		case done := <-j.waiting:
			answers = append(answers, done)
		}
		answers = j.queued(answers)
		j.run()
		for _, done := range answers {
			close(done)
		}
	}
}

// queued adds the requests waiting now to answers, and takes a pending
// ask: the run about to begin serves them all.
func (j *job) queued(answers []chan struct{}) []chan struct{} {
	for {
		select {
		case done := <-j.waiting:
			answers = append(answers, done)
		case <-j.asked:
		default:
			return answers
		}
	}
}
