"""The console (Textual). `app.ConsoleApp` is the app; `rows` says what each view shows (pure), `table` the
diffing table, `views` the numbered views, `detail` the job and node screens, `dialogs` the modal dialogs,
and `feed` how the data comes from the scheduler's client API."""
