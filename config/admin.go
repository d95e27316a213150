package config

// Admin is the admin service every instance serves on NATS
// (internal/admin): inspect and forget a key, and the instance's status.
type Admin struct {
	// Disabled turns the service off. Default false: served.
	Disabled bool `yaml:"disabled"`
	// Subject is the prefix of the service's subjects: <subject>.inspect,
	// <subject>.forget and <subject>.status. Default "" means
	// "dedupe.admin.<name>", with name scale_out.group in a group, else
	// input.consumer: the instances of one stage share it, and NATS
	// permissions on it decide who may inspect and who may forget.
	Subject string `yaml:"subject"`
}

// AdminSubject returns the prefix of the admin service's subjects:
// admin.subject, or its default (see Admin.Subject).
func (c Config) AdminSubject() string {
	if c.Admin.Subject != "" {
		return c.Admin.Subject
	}
	if c.ScaleOut.Enabled {
		return "dedupe.admin." + c.ScaleOut.Group
	}
	return "dedupe.admin." + c.Input.Consumer
}

// validateAdmin checks admin.subject: a literal subject.
func (c Config) validateAdmin(v *validator) {
	if c.Admin.Subject == "" {
		return
	}
	if msg := checkSubject(c.Admin.Subject, false); msg != "" {
		v.add("admin.subject", "%q: %s", c.Admin.Subject, msg)
	}
}
