"""fa_course in other libraries' attention hooks: `fa_course.integrations.transformers.register()`."""
