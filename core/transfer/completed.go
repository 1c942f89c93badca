package transfer

// Completed returns a notification that has already completed with err
// (nil: success), for work that needed no transfer.
func Completed(err error) *Notification { return completed(err) }
