// A member of a consumer group, for the tests: kafka-python joins only with the classic
// protocol; this joins with the one asked for (KIP-848's "consumer" by default), reads, and
// commits what it read only when told to ("commit"; otherwise what the group has committed is
// the test's to check), and leaves the group when stdin closes or on SIGTERM.
//
// Run with the JDK's source launcher, no build step (testbed/group_member.py does):
//   java -cp '<kafka lib>/*' GroupMember.java <bootstrap> <group> <topic> \
//       [consumer|classic] [commit|read]
// It prints "assigned <topic>-<p>,..." whenever its assignment changes (KIP-848's first one
// may be empty), "left" when it left.

import java.time.Duration;
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class GroupMember {
    public static void main(String[] args) throws Exception {
        String protocol = args.length > 3 ? args[3] : "consumer";
        boolean commit = args.length > 4 && args[4].equals("commit");
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("group.id", args[1]);
        props.put("group.protocol", protocol);
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        if (protocol.equals("classic")) {
            props.put("session.timeout.ms", "6000");
            props.put("heartbeat.interval.ms", "1000");
        }
        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);
        AtomicBoolean stopping = new AtomicBoolean(false);
        Thread main = Thread.currentThread();
        Runnable stop = () -> {
            if (stopping.compareAndSet(false, true)) {
                consumer.wakeup();
            }
        };
        Thread watcher = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                    // a line from the test means nothing: only the end of stdin stops
                }
            } catch (Exception ignored) {
                // stdin gone: stop as well
            }
            stop.run();
        });
        watcher.setDaemon(true);
        watcher.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stop.run();
            try {
                main.join(10_000);
            } catch (InterruptedException ignored) {
                // exiting anyway
            }
        }));
        consumer.subscribe(List.of(args[2]), new ConsumerRebalanceListener() {
            public void onPartitionsRevoked(Collection<TopicPartition> parts) {}

            public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                TreeSet<String> names = new TreeSet<>();
                for (TopicPartition tp : consumer.assignment()) {
                    names.add(tp.toString());
                }
                System.out.println("assigned " + String.join(",", names));
                System.out.flush();
            }
        });
        try {
            while (!stopping.get()) {
                if (!consumer.poll(Duration.ofMillis(200)).isEmpty() && commit) {
                    consumer.commitSync();
                }
            }
        } catch (WakeupException ignored) {
            // asked to stop
        } finally {
            consumer.close(Duration.ofSeconds(10));
            System.out.println("left");
            System.out.flush();
        }
    }
}
