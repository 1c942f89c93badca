package worker

// HasObjects reports whether the worker has a G4 object store.
func (w *PhysicalWorker) HasObjects() bool { return w.objects != nil }
