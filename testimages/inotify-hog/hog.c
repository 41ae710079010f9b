/* The end-to-end suite's inotify hog: holds N inotify instances (argv[1], default 8) and
 * sleeps, as a file watcher that never closes its instances would. Built static by the test
 * (`cc -static`) and copied into a container of the suite's web image, which has no libc. */
#include <stdlib.h>
#include <sys/inotify.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 8;
    for (int i = 0; i < n; i++) {
        if (inotify_init1(IN_CLOEXEC) < 0) {
            return 1;
        }
    }
    for (;;) {
        pause();
    }
}
